"""One forward pass over several sequences (`Transformer.decode_batch`) against each decoded alone.

The reference is the single-sequence decode step, which the parity tests hold to NumPy and
to transformers. Each sequence has its own prompt length (two of them equal, so the batch
has repeated and far-apart positions), its own cache, and its own tokens; the batch is fed
the tokens each sequence decoded alone, so every step compares the same computation. The
sliding-window (Gemma 3) and soft-capped (Gemma 2) models check that each row attends to
its own cache with its layer's settings.
"""

import numpy as np
import pytest

from backends.base import Segment
from backends.kv_types import DEFAULT_KV_TYPE
from engine.generation import prefill
from engine.loader import load_model
from tests.engine.parity_models import model_path, op_by_op

PROMPT_LENGTHS = (3, 21, 9, 9)  # past the tiny Gemmas' window of 16; two at the same positions
STEPS = 6


def decode_alone(loaded, prompt: list[int]) -> tuple[list[int], list[np.ndarray]]:
    """Greedy tokens after `prompt`, one decode step at a time: (tokens, logits (vocab,) per step)."""
    cache = loaded.new_cache(64)
    logits = prefill(loaded.model, cache, prompt)
    step = loaded.model.decode_step(cache.storage)
    tokens, seen = [], []
    for n in range(STEPS):
        tokens.append(int(np.argmax(logits)))
        logits = loaded.backend.to_host(step(tokens[-1], len(prompt) + n))[0]
        seen.append(logits)
    return tokens, seen


@pytest.mark.parametrize("backend", ["numpy", "cpu"])
@pytest.mark.parametrize("key", ["tiny-qwen3-f32", "tiny-qwen3-q1_0", "tiny-gemma3", "tiny-gemma2", "tiny-llama"])
def test_a_batched_step_gives_every_sequence_its_own_logits(tmp_path, backend, key):
    # NumPy's batch is compared within float32 tolerance: a float32 cache, since BLAS sums a
    # batch's keys in another order than one sequence's, and a key that lands on the other side
    # of a float16 rounding moves the logits by more than that (cpu's batch is bit for bit)
    loaded = load_model(model_path(key, tmp_path), backend, kv_type="f32" if backend == "numpy" else DEFAULT_KV_TYPE)
    try:
        rng = np.random.default_rng(3)
        prompts = [rng.integers(0, loaded.config.vocab_size, size=n).tolist() for n in PROMPT_LENGTHS]
        alone = [decode_alone(loaded, p) for p in prompts]

        caches = [loaded.new_cache(64) for _ in prompts]
        for cache, prompt in zip(caches, prompts, strict=True):
            prefill(loaded.model, cache, prompt)
        for n in range(STEPS):
            tokens = np.array([tokens[n] for tokens, _ in alone])  # (B,)
            positions = np.array([len(p) + n for p in prompts])  # (B,)
            batch = loaded.backend.to_host(loaded.model.decode_batch(tokens, positions, [c.storage for c in caches]))
            assert batch.shape == (len(prompts), loaded.config.vocab_size)
            for b, (_, logits) in enumerate(alone):
                if backend == "cpu":  # the recorded batch pass: each row's arithmetic is its own step's
                    np.testing.assert_array_equal(batch[b], logits[n], err_msg=f"step {n} row {b}")
                    continue
                spread = float(np.ptp(logits[n]))
                np.testing.assert_allclose(batch[b], logits[n], rtol=0, atol=1e-5 * spread, err_msg=f"step {n} row {b}")
    finally:
        loaded.close()


def test_the_cpu_backend_records_a_batch_pass_once_per_batch_size(tmp_path):
    loaded = load_model(model_path("tiny-qwen3-f32", tmp_path), "cpu")
    try:
        caches = [loaded.new_cache(64) for _ in range(5)]
        for i, cache in enumerate(caches):
            prefill(loaded.model, cache, [5 + i, 6, 7])  # each sequence its own prompt
        groups = [caches[0:2], caches[1:3], caches[3:5], caches[2:5], caches[0:3]]
        for n, group in enumerate(groups):
            tokens, positions = np.arange(8, 8 + len(group)), np.full(len(group), 3 + n)
            logits = loaded.model.decode_batch(tokens, positions, [c.storage for c in group])
            eager = op_by_op(loaded.model, tokens, [Segment(c.storage, int(p), 1) for c, p in zip(group, positions)])
            np.testing.assert_array_equal(logits, eager)  # the replayed pass is the op-by-op pass, on these storages
        batch_passes = [key for key in loaded.model.runner.passes if key[0] == "batch"]
        assert sorted(key[1] for key in batch_passes) == [2, 3]  # one recording per batch size
    finally:
        loaded.close()


def test_a_batch_of_one_is_the_decode_step(tmp_path):
    loaded = load_model(model_path("tiny-qwen3-f32", tmp_path), "numpy")
    try:
        prompt = [5, 6, 7]
        (token, *_), (logits, *_) = decode_alone(loaded, prompt)
        cache = loaded.new_cache(64)
        prefill(loaded.model, cache, prompt)
        batch = loaded.model.decode_batch(np.array([token]), np.array([len(prompt)]), [cache.storage])
        np.testing.assert_array_equal(loaded.backend.to_host(batch)[0], logits)
    finally:
        loaded.close()
