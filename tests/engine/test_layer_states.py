"""Each layer's own state: a sliding window kept as a ring of its window, rolled back, and
read again where a rollback goes further than the ring allows."""

import numpy as np
import pytest

import engine.models.attention
from backends.base import AttentionState, RecurrentState
from backends.numpy_backend import NumpyBackend
from engine.loader import load_model
from tests.gguf_factory import write_tiny_model

BACKENDS = ["numpy", "cpu"]
N_CTX = 96  # gemma3's tiny files have a window of 16: rings of 16 + 8 - 1 slots below


@pytest.fixture(scope="module")
def gemma3_path(tmp_path_factory):
    return write_tiny_model(tmp_path_factory.mktemp("ring") / "g3.gguf", arch="gemma3", n_layers=6)


@pytest.fixture(params=BACKENDS)
def loaded(request, gemma3_path):
    # float32 keys: NumPy's products round differently in passes of other lengths, and a
    # float16 cache can turn those last-bit differences into whole float16 steps
    model = load_model(gemma3_path, backend=request.param, kv_type="f32")
    yield model
    model.close()


def ring_cache(loaded, monkeypatch):
    monkeypatch.setattr(engine.models.attention, "RING_SLACK", 8)
    return loaded.new_cache(N_CTX)


def test_local_layers_keep_a_ring_and_global_ones_the_context(loaded, monkeypatch):
    cache = ring_cache(loaded, monkeypatch)
    layouts = loaded.model.layer_states(N_CTX)
    assert [s.slots for s in layouts] == [23] * 5 + [N_CTX]  # window 16 + slack 8 - 1
    assert [s.window for s in layouts] == [16] * 5 + [None]
    assert (cache.pass_tokens, cache.rewind_limit) == (8, 8)
    monkeypatch.setattr(engine.models.attention, "RING_SLACK", 1024)
    full = loaded.new_cache(N_CTX)
    assert cache.memory_bytes() < full.memory_bytes()


def test_a_ring_gives_the_logits_of_the_whole_context(loaded, monkeypatch):
    tokens = np.random.default_rng(1).integers(0, 280, size=80)
    full = loaded.new_cache(N_CTX)  # no ring: the window is read from full-length storage
    expected = full.feed(loaded.model, tokens, all_logits=True)  # (80, vocab)
    ring = ring_cache(loaded, monkeypatch)
    got = [ring.feed(loaded.model, tokens[lo:hi], all_logits=True) for lo, hi in ((0, 30), (30, 31), (31, 36), (36, 80))]
    np.testing.assert_allclose(np.concatenate(got), expected, rtol=0, atol=1e-5)
    assert np.array_equal(np.argmax(np.concatenate(got), axis=1), np.argmax(expected, axis=1))


def test_a_rollback_within_the_ring_forgets_and_one_beyond_it_reads_again(loaded, monkeypatch):
    rng = np.random.default_rng(2)
    prompt, other = rng.integers(0, 280, size=60), rng.integers(0, 280, size=12)
    fresh = loaded.new_cache(N_CTX)
    expected = fresh.feed(loaded.model, [*prompt[:50], *other[:3]])  # (1, vocab)
    ring = ring_cache(loaded, monkeypatch)
    ring.feed(loaded.model, prompt)
    ring.truncate(52)  # 8 back: within the ring, forgotten in place
    assert ring.rereads == 0
    ring.truncate(50)
    assert ring.rereads == 0 and ring.n_used == 50
    ring.feed(loaded.model, other)
    ring.truncate(45)  # 17 back: beyond the ring, read again from the start
    assert ring.rereads == 1 and ring.tokens == tuple(int(t) for t in prompt[:45])
    ring.truncate(0)
    ring.feed(loaded.model, prompt[:50])
    got = ring.feed(loaded.model, other[:3])
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-5)


def test_a_recurrent_state_has_fixed_room_and_starts_again_at_zero():
    backend = NumpyBackend()
    state = backend.allocate_state([RecurrentState(((2, 3), (4,))), AttentionState(1, 2, 2, 8)])
    assert backend.state_bytes(state) == 4 * (6 + 4) + 4 * 2 * 8 * 2
    state.arrays[0][0][:] = 1.0
    backend.forget(state, 3, 5)  # positions cannot be forgotten from a recurrent state
    assert state.arrays[0][0].sum() == 6
    backend.forget(state, 0, 5)  # from the start: a fresh sequence
    assert state.arrays[0][0].sum() == 0
