"""Qwen3-MoE and gpt-oss against transformers in float32 (fixtures from
tools/fixtures/make_moe_fixtures.py: tiny random models converted and quantized by llama.cpp).

NumPy is the reference: its logits within 1e-3 of the logit range of transformers', on the
F32 files and on each quantized file (against transformers run on that file's weights,
dequantized by gguf-py), its router choosing each layer's experts as transformers does, and
its greedy continuations equal on the F32 files. Faster backends: within 5e-2 of the range
with the same top token."""

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from backends.base import Segment
from engine.loader import load_model
from tests.engine.parity_models import op_by_op

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
FILES = {"tiny-qwen3moe": ("f32", "q8_0", "q4_k_m"), "tiny-gpt-oss": ("f32", "q8_0", "mxfp4")}
CASES = [(name, quant) for name, quants in FILES.items() for quant in quants]
N_PROMPTS = 4


def reference(name: str) -> dict[str, np.ndarray]:
    with np.load(FIXTURES / "reference" / f"{name}.npz") as z:
        return {k: z[k] for k in z.files}


def expected(ref: dict, quant: str, key: str) -> np.ndarray:
    """The reference for a file: transformers on its own (dequantized) weights."""
    return ref[key if quant == "f32" else f"{quant}_{key}"]


def load(name: str, quant: str, backend: str):
    # a float32 KV cache, as transformers keeps its keys and values: the router weights are compared to 1e-4
    return load_model(FIXTURES / "models" / f"{name}-{quant}.gguf", backend=backend, kv_type="f32")


@pytest.mark.parametrize(("name", "quant"), CASES)
def test_numpy_logits_and_router_choices_equal_transformers(name, quant, monkeypatch):
    ref, loaded = reference(name), load(name, quant, "numpy")
    try:
        choices: list[np.ndarray] = []
        route = loaded.backend.route
        monkeypatch.setattr(loaded.backend, "route", lambda logits, routing: choices.append(route(logits, routing))
                            or choices[-1])
        for k in range(N_PROMPTS):
            prompt = ref[f"prompt_{k}"]
            choices.clear()
            logits = loaded.model.forward(prompt, 0, loaded.new_cache(64).storage)[-1]  # (vocab,)
            want = expected(ref, quant, "logits")[k]
            np.testing.assert_allclose(logits, want, rtol=0, atol=1e-3 * np.ptp(want), err_msg=f"prompt {k}")
            n_used = choices[0].shape[1] // 2
            ours = np.stack([c[:, :n_used] for c in choices]).astype(np.int64)  # (layers, T, k)
            np.testing.assert_array_equal(ours, expected(ref, quant, f"experts_{k}"), err_msg=f"prompt {k}")
            weights = np.stack([c[:, n_used:] for c in choices])
            np.testing.assert_allclose(weights, expected(ref, quant, f"expert_weights_{k}"), rtol=0, atol=1e-4)
    finally:
        loaded.close()


@pytest.mark.parametrize("name", FILES)
def test_numpy_every_position_and_greedy_equal_transformers(name):
    ref, loaded = reference(name), load(name, "f32", "numpy")
    try:
        all_logits = loaded.model.forward(ref["prompt_2"], 0, loaded.new_cache(64).storage, all_logits=True)
        np.testing.assert_allclose(all_logits, ref["logits_all_2"], rtol=0, atol=1e-3 * np.ptp(ref["logits_all_2"]))
        for k in range(N_PROMPTS):
            tokens, prompt = [], list(ref[f"prompt_{k}"])
            cache = loaded.new_cache(len(prompt) + 33)
            logits = cache.feed(loaded.model, prompt)[-1]
            for _ in range(32):
                tokens.append(int(np.argmax(logits)))
                logits = cache.feed(loaded.model, tokens[-1:])[-1]
            assert tokens == list(ref["greedy"][k]), f"prompt {k}"
    finally:
        loaded.close()


@pytest.mark.parametrize("backend", ["cpu", "mlx"])
@pytest.mark.parametrize(("name", "quant"), CASES)
def test_faster_backends_agree_with_transformers(name, quant, backend):
    if backend == "mlx" and importlib.util.find_spec("mlx") is None:
        pytest.skip("mlx is not installed")
    ref, loaded = reference(name), load(name, quant, backend)
    try:
        assert_last_logits_agree(loaded, ref, quant, N_PROMPTS)
    finally:
        loaded.close()


def assert_last_logits_agree(loaded, ref: dict, quant: str, n_prompts: int) -> None:
    """Each prompt's last logits within 5e-2 of the range of the reference's, the same top token."""
    for k in range(n_prompts):
        prompt = ref[f"prompt_{k}"]
        logits = loaded.model.forward(prompt, 0, loaded.new_cache(len(prompt)).storage)[-1]
        want = expected(ref, quant, "logits")[k]
        np.testing.assert_allclose(logits, want, rtol=0, atol=5e-2 * np.ptp(want), err_msg=f"prompt {k}")
        assert int(np.argmax(logits)) == int(np.argmax(want)), f"prompt {k}"


@pytest.mark.parametrize(("name", "quant"), [("tiny-qwen3moe", "q4_k_m"), ("tiny-gpt-oss", "mxfp4")])
def test_cpu_greedy_equals_numpy_and_its_recorded_passes_the_op_by_op_ones(name, quant):
    ref = reference(name)
    rng = np.random.default_rng(7)  # the fixture's 4 prompts and 6 more of random tokens: 10 in all
    prompts = [list(ref[f"prompt_{k}"]) for k in range(N_PROMPTS)]
    prompts += [list(rng.integers(0, 384, size=n)) for n in (5, 9, 12, 17, 23, 30)]
    runs = {}
    for backend in ("numpy", "cpu"):
        loaded = load(name, quant, backend)
        try:
            runs[backend] = []
            for prompt in prompts:
                cache = loaded.new_cache(len(prompt) + 33)
                logits, tokens = cache.feed(loaded.model, prompt)[-1], []
                for _ in range(32):  # one-token passes: recorded and replayed on cpu
                    tokens.append(int(np.argmax(logits)))
                    logits = cache.feed(loaded.model, tokens[-1:])[-1]
                runs[backend].append(tokens)
            if backend == "cpu":  # a draft's check and a batch of two sequences, against the ops one by one
                prompt = list(ref["prompt_2"])
                recorded, eager = loaded.new_cache(64), loaded.new_cache(64)
                for cache in (recorded, eager):
                    cache.feed(loaded.model, prompt[:30])
                checked = loaded.model.forward(np.asarray(prompt[30:34]), 30, recorded.storage, all_logits=True)
                reference_pass = op_by_op(loaded.model, prompt[30:34], [Segment(eager.storage, 30, 4)])
                np.testing.assert_array_equal(checked, reference_pass)
                batch = loaded.model.decode_batch(np.array([5, 9]), np.array([34, 34]), [recorded.storage, eager.storage])
                alone = [op_by_op(loaded.model, [t], [Segment(s, 34, 1)]) for t, s in ((5, recorded.storage),)]
                np.testing.assert_array_equal(batch[:1], alone[0])
        finally:
            loaded.close()
    same = sum(a == b for a, b in zip(runs["cpu"], runs["numpy"], strict=True))
    assert same >= 9, runs  # at least 9 of 10 prompts: one may part at a near-tie
