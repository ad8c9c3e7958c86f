"""Per-layer state (`allocate_state`, `state_bytes`, `forget`) on the cpu and NumPy backends,
and windowed rings.

- A ring layer (window 32, `slots` 32 + 16 - 1 = 47, or 100) fed 300 positions of random
  queries, keys and values in passes of 1 to 16 tokens after a prefill chunk gives, on the
  cpu backend (every tier this machine runs, 1 and 2 threads), the bits of a full-length
  layer with the same window, and on NumPy the same within 1e-6; both match the textbook
  loops.
- A recorded pass (`compile_forward`) on a state whose layer 1 is a ring replays on another
  state of the same layout, and gives the bits of the op-by-op pass over a full-length one.
- Forgetting the last positions of a ring (a rejected draft) and feeding others gives what a
  run that never saw the forgotten ones gives, and zeroes their slots (the cpu ring's mirror
  too).
- A pass longer than a ring holds (window + tokens - 1 > slots), or one without a window, is
  refused, saying so.
- The cpu state is one 64-byte aligned arena holding every layer; sizes are reported.
"""

import itertools

import numpy as np
import pytest

from backends import cpu_native
from backends.base import AttentionState, LayerAttention, PassInput, RecurrentState, Runner, Segment
from backends.cpu_backend import CpuBackend, CpuMatrix
from backends.cpu_runner import RecordingRunner
from backends.numpy_backend import NumpyBackend
from tests.backends.test_numpy_backend import naive_attention

TIERS = cpu_native.runnable_tiers()
HEADS, KV_HEADS, DH, DV = 4, 2, 16, 8
WINDOW, TOTAL = 32, 300
SETTINGS = LayerAttention(scale=0.25, window=WINDOW)
BACKENDS = [pytest.param(("cpu", tier, threads), id=f"cpu-{tier}-{threads}") for tier in TIERS for threads in (1, 2)]
BACKENDS.append(pytest.param(("numpy", None, None), id="numpy"))


def make_backend(kind: tuple):
    name, tier, threads = kind
    return CpuBackend(threads=threads, tier=tier) if name == "cpu" else NumpyBackend()


def qkv(seed: int, total: int = TOTAL) -> list[np.ndarray]:
    """Queries (total, H, Dh), keys (total, Hkv, Dh), values (total, Hkv, Dv)."""
    rng, shapes = np.random.default_rng(seed), ((HEADS, DH), (KV_HEADS, DH), (KV_HEADS, DV))
    return [rng.standard_normal((total, h, d)).astype(np.float32) for h, d in shapes]


def pass_lengths(first: int, total: int, seed: int) -> list[int]:
    """A prefill chunk of `first`, then passes of 1 to 16 tokens up to `total` positions."""
    rng, lengths = np.random.default_rng(seed), [first]
    while sum(lengths) < total:
        lengths.append(min(int(rng.integers(1, 17)), total - sum(lengths)))
    return lengths


def feed(be, state, layer: int, q, k, v, start: int, lengths: list[int]) -> np.ndarray:
    """Attention of positions start .. start + sum(lengths) - 1 in passes of `lengths`: (T, H * Dv)."""
    out = []
    for n in lengths:
        end = start + n
        out.append(np.array(be.attention(q[start:end], k[start:end], v[start:end], state, layer, start, SETTINGS)))
        start = end
    return np.concatenate(out)


@pytest.mark.parametrize("slots", [WINDOW + 16 - 1, 100])
@pytest.mark.parametrize("kind", BACKENDS)
def test_a_ring_gives_what_a_full_length_layer_gives(kind, slots):
    be = make_backend(kind)
    q, k, v = qkv(slots)
    ring = AttentionState(KV_HEADS, DH, DV, slots=slots, window=WINDOW)
    full = AttentionState(KV_HEADS, DH, DV, slots=TOTAL)
    state = be.allocate_state([full, ring])
    lengths = pass_lengths(ring.pass_tokens, TOTAL, seed=slots)
    ours = feed(be, state, 1, q, k, v, 0, lengths)
    reference = feed(be, state, 0, q, k, v, 0, lengths)
    if kind[0] == "cpu":
        np.testing.assert_array_equal(ours, reference)
    else:
        np.testing.assert_allclose(ours, reference, rtol=0, atol=1e-6)
    expected = naive_attention(q, k, v, range(TOTAL), SETTINGS.scale, WINDOW)
    np.testing.assert_allclose(ours, expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("kind", BACKENDS)
def test_forgetting_a_draft_on_a_ring_then_feeding_others_equals_a_plain_run(kind):
    be = make_backend(kind)
    q, k, v = qkv(7)
    ring = AttentionState(KV_HEADS, DH, DV, slots=WINDOW + 16 - 1, window=WINDOW)
    rolled, plain = be.allocate_state([ring]), be.allocate_state([ring])
    lengths = pass_lengths(ring.pass_tokens, 200, seed=3)
    for state in (rolled, plain):
        feed(be, state, 0, q, k, v, 0, lengths)
    draft = qkv(8)  # other tokens at positions 200 .. 212, then rejected
    feed(be, rolled, 0, *draft, 200, [13])
    be.forget(rolled, 200, 213)
    rows = np.arange(200, 213) % ring.slots
    if kind[0] == "cpu":
        rows = np.concatenate([rows, rows + ring.slots])  # the mirror too
    assert not rolled.keys[0][:, rows].any() and not rolled.values[0][:, rows].any()
    after = feed(be, rolled, 0, q, k, v, 200, [5, 11])
    np.testing.assert_array_equal(after, feed(be, plain, 0, q, k, v, 200, [5, 11]))


@pytest.mark.parametrize("kind", BACKENDS)
def test_a_pass_longer_than_the_ring_holds_is_refused(kind):
    be = make_backend(kind)
    q, k, v = qkv(1, total=20)
    ring = AttentionState(KV_HEADS, DH, DV, slots=WINDOW + 4, window=WINDOW)  # passes of at most 5
    state = be.allocate_state([ring])
    feed(be, state, 0, q, k, v, 0, [5])
    error = RuntimeError if kind[0] == "cpu" else ValueError
    with pytest.raises(error, match="split it"):
        feed(be, state, 0, q, k, v, 5, [6])
    with pytest.raises(error, match="no window" if kind[0] == "cpu" else "window of None"):
        be.attention(q[5:6], k[5:6], v[5:6], state, 0, 5, LayerAttention(scale=0.25))


def test_the_cpu_state_is_one_aligned_arena_of_every_layer():
    be = CpuBackend(threads=1)
    layers = [
        AttentionState(2, 3, 5, slots=7),
        AttentionState(1, 4, 4, slots=6, window=3),
        RecurrentState(((3, 5), (2,))),
    ]
    state = be.allocate_state(layers)
    assert state.arena.ctypes.data % 64 == 0 and state.arena.dtype == np.float32
    views = [state.keys[0], state.values[0], state.keys[1], state.values[1], *state.arrays[2]]
    assert [a.shape for a in views] == [(2, 7, 3), (2, 7, 5), (1, 12, 4), (1, 12, 4), (3, 5), (2,)]
    for a in views:
        assert np.shares_memory(a, state.arena) and (a.ctypes.data - state.arena.ctypes.data) % 64 == 0
    ends = sorted((a.ctypes.data, a.ctypes.data + a.nbytes) for a in views)
    assert all(end <= start for (_, end), (start, _) in itertools.pairwise(ends))  # no two overlap
    assert be.state_bytes(state) == state.arena.nbytes >= sum(a.nbytes for a in views)
    assert state.shape == tuple(layers) and state.keys[2] is None


def test_a_recorded_pass_on_a_ring_replays_on_another_state_and_equals_a_full_length_layer():
    """q, k and v of each token are rows of float tables (embedding ops), so a recorded pass
    computes them from its tokens; its attention op is bound to layer 1 of the state it is
    given, a ring, and must give the op-by-op bits of a full-length layer."""
    be = CpuBackend(threads=2)
    tables = qkv(11, total=64)  # a vocabulary of 64 tokens
    matrices = [CpuMatrix(name, t.reshape(64, -1).view(np.uint8).reshape(-1), 0, 64, t[0].size)
                for name, t in zip("qkv", tables, strict=True)]

    def forward(p: PassInput):
        q, k, v = (be.embedding(m, p.tokens).reshape(len(p.tokens), *t.shape[1:])
                   for m, t in zip(matrices, tables, strict=True))
        segment = p.segments[0]
        return be.attention(q, k, v, segment.state, 1, segment.start, SETTINGS)

    ring = AttentionState(KV_HEADS, DH, DV, slots=WINDOW + 3, window=WINDOW)
    full = AttentionState(KV_HEADS, DH, DV, slots=120)
    tokens = np.random.default_rng(2).integers(0, 64, size=120)
    reference = be.allocate_state([full, full])
    expected = np.array(Runner(forward)(tokens, [Segment(reference, 0, 120)], all_logits=True))  # (120, H * Dv)
    runner = RecordingRunner(be, forward)
    for state in (be.allocate_state([full, ring]), be.allocate_state([full, ring])):  # the second replays
        got = [runner(tokens[at : at + 4], [Segment(state, at, 4)], all_logits=True) for at in range(0, 120, 4)]
        np.testing.assert_array_equal(np.concatenate(got), expected)
    assert runner.recordings == 1
