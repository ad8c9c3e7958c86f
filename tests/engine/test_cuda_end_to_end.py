"""The CUDA backend end to end on the CPU emulator of its kernels, against the NumPy reference.

The same `.cu` kernels a GPU runs (`backends/cuda/kernels/`) run here on the emulator
(`SPRIG_CUDA_DEVICE=emulator`), whole models through `--backend cuda`: the bundled SmolLM2
(Q4_1, Q8_0) and Gemma-3-270M (Q4_K_M's mix), the synthetic Qwen3 fixtures (F32 and Q1_0),
and tiny Llama and Gemma 3 models (sliding windows) written here. Both sides keep an f16 KV
cache (the CUDA backend's only type), so that what differs is the kernels' arithmetic: the
quantized products' activation codes (two 8-bit codes a value: 15 bits) and float16 keys.

What must hold (the issue's bar): the last-position logits within 1e-2 of the logit range
of NumPy's, and 32-token greedy continuations identical. The decode steps go through the
CUDA backend's graph runner (recorded on the second step, replayed after), which must give
exactly the op-by-op pass's logits.
"""

import os
import subprocess
import sys
from dataclasses import dataclass

import numpy as np
import pytest

from backends.base import Segment
from engine.generation import generate
from engine.loader import LoadedModel, load_model
from engine.sampling import SamplingParams
from tests.engine.parity_models import FIXTURES, greedy_forward, model_path, op_by_op

N_GREEDY = 32
PROMPT = "The capital of France is"


@pytest.fixture(autouse=True, scope="module")
def emulated_cuda():
    """`--backend cuda` runs on the emulator for this module, or on the GPU where the GPU
    session asks for it (`SPRIG_CUDA_DEVICE=gpu`: then a GPU that cannot start fails)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SPRIG_CUDA_DEVICE", "gpu" if os.environ.get("SPRIG_CUDA_DEVICE") == "gpu" else "emulator")
        yield


@dataclass
class Pair:
    """One model on NumPy and on CUDA (emulated), and what each computed for one prompt."""

    key: str
    numpy: LoadedModel
    cuda: LoadedModel
    prompt: list[int]
    logits: dict[str, np.ndarray]
    greedy: dict[str, list[int]]


@pytest.fixture(
    scope="module",
    params=[
        pytest.param("smollm2", marks=pytest.mark.slow),
        pytest.param("gemma3", marks=pytest.mark.slow),
        "tiny-qwen3-f32",
        "tiny-qwen3-q1_0",
        "tiny-llama",
        "tiny-gemma3",
    ],
)
def pair(request, tmp_path_factory, emulated_cuda) -> Pair:
    """Load one model on both backends and run the prompt and the greedy continuation once."""
    path = model_path(request.param, tmp_path_factory.mktemp("models"))
    loaded = {name: load_model(path, name, kv_type="f16") for name in ("numpy", "cuda")}
    for model in loaded.values():
        request.addfinalizer(model.close)
    reference = loaded["numpy"]
    if request.param in ("smollm2", "gemma3"):
        prompt = reference.tokenizer.encode(PROMPT, add_bos=reference.tokenizer.add_bos)
    else:
        prompt = np.random.default_rng(5).integers(0, reference.config.vocab_size, size=9).tolist()
    runs = {name: greedy_forward(model, prompt, N_GREEDY) for name, model in loaded.items()}
    return Pair(
        request.param,
        reference,
        loaded["cuda"],
        prompt,
        {name: run[0] for name, run in runs.items()},
        {name: run[1] for name, run in runs.items()},
    )


def test_the_cuda_backend_is_the_one_running(pair):
    assert pair.cuda.backend.name == "cuda"
    on_emulator = os.environ["SPRIG_CUDA_DEVICE"] == "emulator"
    assert ("emulator" in pair.cuda.backend.device_name.lower()) == on_emulator


def test_logits_within_a_hundredth_of_the_range(pair):
    ours, reference = pair.logits["cuda"], pair.logits["numpy"]
    span = float(reference.max() - reference.min())
    assert float(np.abs(ours - reference).max()) <= 1e-2 * span, pair.key


def test_greedy_continuations_identical(pair):
    assert pair.greedy["cuda"] == pair.greedy["numpy"], pair.key


def test_the_replayed_step_equals_the_op_by_op_pass(pair):
    if pair.key in ("smollm2", "gemma3"):
        pytest.skip("the tiny models check the graph runner; a bundled one adds minutes, not coverage")
    model, prompt = pair.cuda, pair.prompt
    replayed, eager = model.new_cache(len(prompt) + 4), model.new_cache(len(prompt) + 4)
    for cache in (replayed, eager):
        model.model.forward(np.asarray(prompt), 0, cache.storage)
    token = pair.greedy["cuda"][0]
    for step in range(3):  # op by op, recorded, replayed
        position = len(prompt) + step
        a = model.model.forward(np.asarray([token]), position, replayed.storage)
        b = model.backend.to_host(op_by_op(model.model, [token], [Segment(eager.storage, position, 1)]))
        np.testing.assert_array_equal(a, b)
        token = int(np.argmax(a))


def test_engine_logits_command_runs_on_the_emulator(tmp_path):
    """`python -m engine logits --backend cuda` under the emulator gives NumPy's logits."""
    path = model_path("tiny-qwen3-f32", tmp_path)
    out = {}
    for backend in ("numpy", "cuda"):
        out[backend] = tmp_path / f"{backend}.npy"
        result = subprocess.run(
            [sys.executable, "-m", "engine", "logits", "--model", str(path), "--tokens", "1,2,3,4,5", "--backend", backend,
             "--out", str(out[backend])],
            capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
    ours, reference = np.load(out["cuda"]), np.load(out["numpy"])
    assert float(np.abs(ours - reference).max()) <= 1e-2 * float(reference.max() - reference.min())


def test_greedy_generation_keeps_tokens_on_the_device(pair):
    """`generate` with greedy sampling: each token picked on the device by `argmax` and fed to
    the next (replayed) step from there; the answer is the greedy continuation."""
    if pair.key in ("smollm2", "gemma3"):
        pytest.skip("the tiny models check the device-token path; a bundled one adds minutes, not coverage")
    model = pair.cuda
    replays = model.model.runner.replays
    cache = model.new_cache(len(pair.prompt) + 8)
    events = list(generate(model.model, model.tokenizer, cache, pair.prompt, SamplingParams.greedy(),
                           max_tokens=8, ignore_stop_tokens=True))  # fmt: skip
    assert [e.token for e in events] == pair.greedy["numpy"][:8]
    assert model.model.runner.replays - replays == 5  # steps 3 to 7: the first runs op by op, the second records


def test_sampled_generation_draws_on_the_device_as_the_host_would(pair):
    """Seeded sampling (top-k, top-p, min-p, temperature): the device draws with the host
    sampler's rules and its generator's numbers, so the text equals NumPy's host-sampled one."""
    if pair.key in ("smollm2", "gemma3"):
        pytest.skip("the tiny models check device sampling; a bundled one adds minutes, not coverage")
    params = SamplingParams(temperature=1.3, top_k=50, top_p=0.9, min_p=0.02, seed=7)
    answers = {}
    for name, model in (("numpy", pair.numpy), ("cuda", pair.cuda)):
        cache = model.new_cache(len(pair.prompt) + 16)
        events = generate(model.model, model.tokenizer, cache, pair.prompt, params, max_tokens=16,
                          ignore_stop_tokens=True)  # fmt: skip
        answers[name] = [e.token for e in events]
    assert answers["cuda"] == answers["numpy"]
    assert len(set(answers["numpy"])) > 3  # sampled, not one token over and over


FAMILY_FIXTURES = [
    "tiny-qwen3moe-q8_0", "tiny-qwen35-q4_k_m", "tiny-qwen35moe-q8_0", "tiny-gpt-oss-mxfp4", "tiny-gemma4-q8_0",
    "tiny-gemma4-moe-q8_0", "tiny-phi3-q4_k_m", "tiny-cohere2-q8_0", "tiny-command-r-q8_0", "tiny-granite-q4_k_m",
    "tiny-starcoder2-q8_0", "tiny-olmo2-q8_0", "tiny-smollm3-q4_k_m", "tiny-gemma-q4_k_m", "tiny-bert-cls-f32",
]  # fmt: skip


@pytest.mark.parametrize("key", FAMILY_FIXTURES)
def test_every_family_runs_on_cuda(key, emulated_cuda):
    """Every other family's fixture (MoE and hybrid layers included, whose experts and Gated
    DeltaNet still run on the host through the CUDA backend) gives NumPy's logits."""
    path = FIXTURES / f"{key}.gguf"
    prompt = np.arange(1, 12) * 7 % 200
    logits = {}
    for name in ("numpy", "cuda"):
        loaded = load_model(path, name, kv_type="f16")
        try:
            cache = loaded.new_cache(len(prompt) + 2)
            logits[name] = loaded.model.forward(prompt, 0, cache.storage, all_logits=True)  # (T, vocab)
            logits[name + " step"] = loaded.model.forward(np.asarray([3]), len(prompt), cache.storage)
        finally:
            loaded.close()
    for part in ("", " step"):
        reference = logits["numpy" + part]
        span = float(reference.max() - reference.min())
        assert float(np.abs(logits["cuda" + part] - reference).max()) <= 1e-2 * span, f"{key}{part}"
