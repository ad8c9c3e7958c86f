"""The MLX backend end to end, against the NumPy backend on the same model files.

Models: SmolLM2 (llama; Q4_1 and Q8_0) and Gemma-3-270M (gemma3; Q8_0, Q5_0, Q4_K and
float16 Q6_K) from their packages; the tiny synthetic Qwen3 fixtures (F32 and Q1_0); and
a tiny Gemma 3 (sliding window of 16) and Gemma 2 (soft-capped attention and logits)
written here, since the bundled models' short prompts never reach Gemma 3's window of 512.

For each model:
- the last-position logits of every prompt agree within 1e-2 of the NumPy logits' range
  (MLX keeps the types without an exact affine form but F32, such as Gemma's Q6_K, as
  float16: Gemma differs by 1.7e-4 of the range, the others by about 1e-6);
- 32 greedy tokens are identical through `forward`, one token at a time (the compiled
  decode step, argmax on the host);
- greedy `generate` gives identical tokens and text (the argmax stays on the device and
  each step is queued before the token before it is read back).
Also: the compiled step is traced once per span bucket, not once per step; generation on
a worker thread after loading on the main one (as the app does); the CLI's --backend mlx.
"""

import json
import subprocess
import sys
import threading
from dataclasses import dataclass

import numpy as np
import pytest

from engine.generation import generate
from engine.loader import LoadedModel, load_model
from engine.sampling import SamplingParams
from tests.engine.parity_models import FIXTURES, greedy_forward, load_on_both

pytest.importorskip("mlx.core", reason="mlx is not installed (pip install 'sprig[mlx]')")

from backends import mlx_backend  # noqa: E402  (after the skip)

REPO_ROOT = FIXTURES.parents[2]
LOGIT_TOLERANCE = 1e-2  # of the NumPy logit vector's range (max - min)
N_GREEDY = 32
GREEDY = SamplingParams.greedy()
TEXT_PROMPTS = ["The capital of France is", "def fibonacci(n):\n    "]


@dataclass
class Pair:
    """One model on both backends, and what each computed."""

    key: str
    numpy: LoadedModel
    mlx: LoadedModel
    prompts: list[list[int]]
    logits: dict[str, list[np.ndarray]]  # backend -> last-position logits per prompt, (vocab,)
    forward_greedy: dict[str, list[int]]  # backend -> greedy tokens through forward, after prompts[0]
    generated: dict[str, tuple[list[int], str]]  # backend -> generate's tokens and text, after prompts[-1]


def run_generate(loaded: LoadedModel, prompt: list[int], params: SamplingParams = GREEDY,
                 n_ctx: int | None = None) -> tuple[list[int], str]:
    """Tokens and text of `generate` after `prompt`, at most N_GREEDY tokens."""
    cache = loaded.new_cache(n_ctx or len(prompt) + N_GREEDY)
    events = list(generate(loaded.model, loaded.tokenizer, cache, prompt, params, max_tokens=N_GREEDY))
    return [e.token for e in events], "".join(e.text for e in events)


def prompts_for(key: str, loaded: LoadedModel) -> list[list[int]]:
    if key in ("smollm2", "gemma3"):
        return [loaded.tokenizer.encode(text, add_bos=loaded.tokenizer.add_bos) for text in TEXT_PROMPTS]
    rng = np.random.default_rng(5)
    return [rng.integers(0, loaded.config.vocab_size, size=n).tolist() for n in (1, 9, 23)]


@pytest.fixture(scope="module", params=[
    pytest.param("smollm2", marks=pytest.mark.slow),
    pytest.param("gemma3", marks=pytest.mark.slow),
    "tiny-qwen3-f32", "tiny-qwen3-q1_0", "tiny-gemma3", "tiny-gemma2",
])
def pair(request, tmp_path_factory) -> Pair:
    """Load one model on both backends and run everything once for the whole module."""
    loaded = load_on_both(request, request.param, tmp_path_factory.mktemp("models"), "mlx")
    prompts = prompts_for(request.param, loaded["numpy"])
    logits, forward_greedy, generated = {}, {}, {}
    for name, model in loaded.items():
        first_logits, forward_greedy[name] = greedy_forward(model, prompts[0], N_GREEDY)
        logits[name] = [first_logits] + [greedy_forward(model, p, 0)[0] for p in prompts[1:]]
        generated[name] = run_generate(model, prompts[-1])
    return Pair(request.param, loaded["numpy"], loaded["mlx"], prompts, logits, forward_greedy, generated)


def test_the_mlx_backend_is_the_one_running(pair):
    assert pair.mlx.backend.name == "mlx" and pair.numpy.backend.name == "numpy"


def test_last_position_logits_match_numpy(pair):
    for k, (ours, reference) in enumerate(zip(pair.logits["mlx"], pair.logits["numpy"])):
        span = float(reference.max() - reference.min())
        worst = float(np.abs(ours - reference).max())
        assert worst <= LOGIT_TOLERANCE * span, (
            f"{pair.key} prompt {k}: max |diff| {worst:.3g} is {worst / span:.2e} of the range {span:.3g}")


def test_greedy_tokens_through_the_compiled_step_match_numpy(pair):
    ours, reference = pair.forward_greedy["mlx"], pair.forward_greedy["numpy"]
    differ = [step for step, (a, b) in enumerate(zip(ours, reference)) if a != b]
    assert ours == reference, f"{pair.key}: the tokens first differ at step {differ[:1]}"


def test_greedy_generate_with_the_token_on_the_device_matches_numpy(pair):
    assert pair.generated["mlx"] == pair.generated["numpy"]


# -- the compiled step, threads and the CLI, on the tiny Qwen3 -------------------------


@pytest.fixture(scope="module")
def tiny() -> dict[str, LoadedModel]:
    loaded = {name: load_model(FIXTURES / "tiny-qwen3-f32.gguf", name) for name in ("numpy", "mlx")}
    yield loaded
    for model in loaded.values():
        model.close()


def test_the_decode_step_is_traced_once_per_span_bucket_not_per_step(tiny, monkeypatch):
    monkeypatch.setattr(mlx_backend, "SPAN_BUCKET", 16)
    prompt = list(range(40, 50))  # decoding covers positions 10 .. 41: the buckets ending at 16, 32 and 48
    traces_before = tiny["mlx"].backend.decode_traces
    ours = run_generate(tiny["mlx"], prompt, n_ctx=64)
    assert tiny["mlx"].backend.decode_traces - traces_before == 3
    assert ours == run_generate(tiny["numpy"], prompt, n_ctx=64)


@pytest.mark.parametrize("params,expected", [
    # greedy: the step after token n is queued (from the token on the device) before token n is read
    (GREEDY, ["queue 12", "queue 13", "read", "queue 14", "read", "queue 15", "read", "read"]),
    # sampling: token n is read (and sampled on the host) before the step after it is queued
    (SamplingParams(temperature=0.8, seed=1),
     ["queue 12", "read", "queue 13", "read", "queue 14", "read", "queue 15", "read"]),
], ids=["greedy", "sampled"])
def test_what_generate_queues_before_it_reads(tiny, monkeypatch, params, expected):
    loaded = tiny["mlx"]
    prompt = list(range(200, 212))
    cache = loaded.new_cache(64)
    step = loaded.model.runner.step(cache.storage)  # compiled once per state; recorded below
    order = []
    cache.storage.decode_step = lambda token, start: order.append(f"queue {start}") or step(token, start)
    to_host = loaded.backend.to_host
    monkeypatch.setattr(loaded.backend, "to_host", lambda x: order.append("read") or to_host(x))
    events = list(generate(loaded.model, loaded.tokenizer, cache, prompt, params, max_tokens=5))
    assert [e.finish_reason for e in events] == [None] * 4 + ["length"]
    assert order[1:] == expected  # order[0]: reading the prefill's logits


def test_sampled_generate_matches_numpy(tiny):
    """Sampling on the host from the MLX logits, step n + 1 queued before token n is handed out."""
    params = SamplingParams(temperature=0.8, top_k=20, seed=3)
    prompt = list(range(100, 112))
    assert run_generate(tiny["mlx"], prompt, params) == run_generate(tiny["numpy"], prompt, params)


def test_a_second_turn_on_a_worker_thread_continues_the_main_threads_cache(tiny):
    """Since MLX 0.31.2 only the thread that made an unevaluated array may evaluate it; the
    app loads a model and makes its cache on one thread and generates on a worker."""
    def two_turns(loaded: LoadedModel, second_turn_on_a_worker: bool) -> list[list[int]]:
        cache = loaded.new_cache(128)
        first = [e.token for e in generate(loaded.model, loaded.tokenizer, cache, list(range(60, 75)), GREEDY,
                                           max_tokens=8)]
        prompt = list(cache.tokens) + [first[-1], 80, 81]
        turns = [first]

        def second_turn():
            turns.append([e.token for e in generate(loaded.model, loaded.tokenizer, cache, prompt, GREEDY,
                                                    max_tokens=8)])

        if second_turn_on_a_worker:
            worker = threading.Thread(target=second_turn)
            worker.start()
            worker.join()
        else:
            second_turn()
        return turns

    assert two_turns(tiny["mlx"], True) == two_turns(tiny["numpy"], False)


@pytest.mark.slow
def test_cli_generates_with_the_mlx_backend():
    def cli(backend: str) -> dict:
        out = subprocess.run(
            [sys.executable, "-m", "engine", "generate", "--model", "smollm2", "--backend", backend,
             "--prompt", "What is the capital of France?", "--max-tokens", "12", "--json"],
            cwd=REPO_ROOT, capture_output=True, text=True, timeout=300, check=True)
        return json.loads(out.stdout)

    ours, reference = cli("mlx"), cli("numpy")
    assert ours["backend"] == "mlx"
    assert (ours["tokens"], ours["text"]) == (reference["tokens"], reference["text"])
    assert "Paris" in ours["text"]
