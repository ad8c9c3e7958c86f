"""The KV cache's number formats (backends/kv_types.py) and the cpu backend's blocked attention.

- The rounding: float16 keeps each value within 2^-11 of itself (relative); Q8_0 within
  max|block| * (1/254 + 2^-11): half a code step, d / 2 with d = max|block| / 127, plus the
  scale's own float16 rounding (at most 2^-11 d) times the largest code, 127. Q8_0 blocks
  are GGUF's: gguf-py reads ours back to the same values, and makes the same codes.
- The cpu kernels store the same bits as the NumPy reference, for every type.
- Blocked attention (online softmax over blocks of 64 and spans of 1024 positions) equals
  plain float64 attention over the same stored values on 3000 positions, for decode steps
  and prefill chunks, windows, soft-capping and sinks; threads split across row groups or
  across spans give the same bits, and so does every instruction-set tier.
- Attention over a rounded cache stays within the bound the rounding gives: with each score
  off by at most |ds| = scale * sum_i |q_i| dk_i and each value by dv, the output moves by at
  most max dv + (e^(2 max |ds|) - 1) max |v| (a softmax's weights move by at most that factor).
"""

import numpy as np
import pytest
from gguf import GGMLQuantizationType, quants

from backends import cpu_native
from backends.base import AttentionState, LayerAttention
from backends.cpu_backend import CpuBackend
from backends.kv_types import KV_TYPES, decode_rows, encode_rows, kv_row_bytes, kv_storage
from backends.numpy_backend import NumpyBackend

TIERS = cpu_native.runnable_tiers()
F16_ROUNDING = 2.0**-11
Q8_0_ROUNDING = 1 / 254 + 2.0**-11  # of the block's largest magnitude
LONG = 3000  # positions: two spans of 1024 and a part, 47 blocks of 64
KV_HEADS, HEADS, DH, DV = 2, 6, 64, 32


def rounding_bound(kv_type: str, x: np.ndarray) -> np.ndarray:
    """The most each value of rows x (..., dim) may move when stored as `kv_type`."""
    if kv_type == "f32":
        return np.zeros_like(x)
    if kv_type == "f16":
        return np.abs(x) * F16_ROUNDING + 2.0**-25  # (and half a float16 subnormal step)
    blocks = np.abs(x).reshape(*x.shape[:-1], -1, 32).max(axis=-1, keepdims=True)  # (..., dim / 32, 1)
    return np.broadcast_to(blocks * Q8_0_ROUNDING * (1 + 1e-6), (*blocks.shape[:-1], 32)).reshape(x.shape)


def test_rounding_stays_within_the_stated_bounds():
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((64, 256)) * np.exp(rng.uniform(-6, 6, (64, 1)))).astype(np.float32)
    x[3, :32] = 0.0  # a block of zeros: scale 0, codes 0
    for kv_type in KV_TYPES:
        back = decode_rows(encode_rows(kv_type, x))
        assert back.dtype == np.float32 and back.shape == x.shape
        assert np.all(np.abs(back - x) <= rounding_bound(kv_type, x)), kv_type
    assert np.array_equal(decode_rows(encode_rows("f32", x)), x)
    assert not np.array_equal(decode_rows(encode_rows("f16", x)), x)  # the rounding does happen
    assert np.all(decode_rows(encode_rows("q8_0", x))[3, :32] == 0.0)


def test_q8_0_blocks_are_gguf_q8_0():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((16, 128)).astype(np.float32)
    ours = encode_rows("q8_0", x)  # (16, 4) blocks
    assert ours.nbytes == 16 * kv_row_bytes("q8_0", 128) == 16 * 4 * 34
    raw = np.frombuffer(ours.tobytes(), dtype=np.uint8).reshape(16, -1)
    read_by_gguf = quants.dequantize(raw, GGMLQuantizationType.Q8_0)
    np.testing.assert_array_equal(read_by_gguf, decode_rows(ours))
    theirs = np.frombuffer(quants.quantize(x, GGMLQuantizationType.Q8_0).tobytes(), dtype=ours.dtype).reshape(16, 4)
    np.testing.assert_array_equal(theirs["d"], ours["d"])
    # gguf-py divides by d where llama.cpp multiplies by 1 / d: a code may differ by one at a tie
    differ = np.abs(theirs["qs"].astype(int) - ours["qs"].astype(int))
    assert differ.max() <= 1 and np.count_nonzero(differ) <= 4


def plain_attention(q, keys, values, positions, scale, window=None, softcap=None, sinks=None):
    """Float64 attention of q (T, H, Dh) at `positions` over keys (Hkv, N, Dh) and values
    (Hkv, N, Dv) at positions 0..N-1: (T, H * Dv)."""
    n_new, n_heads, _ = q.shape
    group = n_heads // keys.shape[0]
    out = np.zeros((n_new, n_heads, values.shape[2]))
    for t, pos in enumerate(positions):
        lo = 0 if window is None else max(0, pos - window + 1)
        for h in range(n_heads):
            k = keys[h // group, lo : pos + 1].astype(np.float64)
            s = k @ q[t, h].astype(np.float64) * scale
            if softcap is not None:
                s = softcap * np.tanh(s / softcap)
            top = s.max() if sinks is None else max(s.max(), sinks[h])
            w = np.exp(s - top)
            total = w.sum() + (0.0 if sinks is None else np.exp(sinks[h] - top))
            out[t, h] = (w / total) @ values[h // group, lo : pos + 1]
    return out.reshape(n_new, -1)


def long_pass(kv_type, settings, n_new, state=None, backend=None, seed=2):
    """Fill a cache of LONG positions (a full one directly, with the NumPy rounding; a ring
    through the cpu backend's attention op, in passes), then run one more pass of `n_new`
    tokens at the end: (its output, the cache, the inputs)."""
    rng = np.random.default_rng(seed)
    backend = backend or CpuBackend(threads=2)
    state = state or AttentionState(KV_HEADS, DH, DV, LONG, kv_type=kv_type)
    cache = backend.allocate_state([state])
    k_all = rng.standard_normal((LONG, KV_HEADS, DH)).astype(np.float32)
    v_all = rng.standard_normal((LONG, KV_HEADS, DV)).astype(np.float32)
    q_all = rng.standard_normal((LONG, HEADS, DH)).astype(np.float32)
    start = LONG - n_new
    step = state.pass_tokens or 512
    if not state.ring:
        cache.keys[0][:, :start] = encode_rows(kv_type, k_all[:start].transpose(1, 0, 2))  # (Hkv, start, Dh)
        cache.values[0][:, :start] = encode_rows(kv_type, v_all[:start].transpose(1, 0, 2))  # (Hkv, start, Dv)
    for lo in range(0, start, step) if state.ring else ():
        hi = min(lo + step, start)
        backend.attention(q_all[lo:hi], k_all[lo:hi], v_all[lo:hi], cache, 0, lo, settings)
    q, k, v = q_all[start:], k_all[start:], v_all[start:]
    out = backend.attention(q, k, v, cache, 0, start, settings)
    return np.asarray(out), cache, (q_all, k_all, v_all, start)


SETTINGS = {
    "plain": LayerAttention(scale=0.125),
    "window": LayerAttention(scale=0.125, window=700),
    "softcap and sinks": LayerAttention(
        scale=0.3, softcap=5.0, sinks=np.random.default_rng(5).standard_normal(HEADS).astype(np.float32)
    ),
}


@pytest.mark.parametrize("kv_type", KV_TYPES)
@pytest.mark.parametrize("kind", list(SETTINGS))
@pytest.mark.parametrize("n_new", [1, 37])
def test_blocked_attention_equals_plain_attention_on_a_long_cache(kv_type, kind, n_new):
    settings = SETTINGS[kind]
    out, cache, (q_all, _, _, start) = long_pass(kv_type, settings, n_new)
    keys, values = decode_rows(cache.keys[0]), decode_rows(cache.values[0])  # what the cache holds, (Hkv, N, D)
    expected = plain_attention(
        q_all[start:],
        keys,
        values,
        range(start, LONG),
        settings.scale,
        settings.window,
        settings.softcap,
        settings.sinks,
    )
    # float32 sums of up to 3000 terms, each at most max|v|: within 1e-5 max|v| of float64 (a
    # position missed or counted twice moves the output by about max|v| / 3000)
    np.testing.assert_allclose(out, expected, rtol=0, atol=1e-5 * np.abs(values).max())


def test_a_ring_gives_the_bits_of_a_full_cache_at_long_positions():
    settings = SETTINGS["window"]
    full, _, _ = long_pass("q8_0", settings, 1)
    ring_state = AttentionState(KV_HEADS, DH, DV, slots=700 + 63, window=700, kv_type="q8_0")  # passes of 64
    ring, _, _ = long_pass("q8_0", settings, 1, state=ring_state)
    np.testing.assert_array_equal(ring.view(np.int32), full.view(np.int32))


@pytest.mark.parametrize("kv_type", ["f16", "q8_0"])
def test_splitting_across_spans_gives_the_bits_of_whole_row_groups(kv_type):
    backend = CpuBackend(threads=1)  # one thread: each row group takes all its spans in turn
    try:
        alone, _, _ = long_pass(kv_type, SETTINGS["softcap and sinks"], 1, backend=backend)
        backend.native.set_threads(8)  # 2 row groups for 8 threads: (row group, span) pairs, merged after
        split, _, _ = long_pass(kv_type, SETTINGS["softcap and sinks"], 1, backend=backend)
    finally:
        backend.native.set_threads(cpu_native.default_threads())
    np.testing.assert_array_equal(split.view(np.int32), alone.view(np.int32))


@pytest.mark.parametrize("kv_type", KV_TYPES)
@pytest.mark.parametrize("kind", list(SETTINGS))
def test_a_rows_output_does_not_depend_on_the_rows_beside_it(kv_type, kind):
    """The last token of a 37-token pass (register tiles of several rows) gets the bits of that
    token attended alone (a decode step), over the same cache."""
    alone, _, _ = long_pass(kv_type, SETTINGS[kind], 1)
    chunk, _, _ = long_pass(kv_type, SETTINGS[kind], 37)
    np.testing.assert_array_equal(chunk[-1:].view(np.int32), alone.view(np.int32))


@pytest.mark.parametrize("kv_type", KV_TYPES)
def test_the_cpu_kernels_store_the_numpy_rounding(kv_type):
    rng = np.random.default_rng(3)
    k = (rng.standard_normal((40, KV_HEADS, DH)) * np.exp(rng.uniform(-8, 8, (40, 1, 1)))).astype(np.float32)
    v = rng.standard_normal((40, KV_HEADS, DV)).astype(np.float32)
    k[5] = 0.0
    q = rng.standard_normal((40, HEADS, DH)).astype(np.float32)
    layers = [AttentionState(KV_HEADS, DH, DV, 64, kv_type=kv_type)]
    states = []
    for backend in (NumpyBackend(), CpuBackend(threads=2)):
        state = backend.allocate_state(layers)
        backend.attention(q, k, v, state, 0, 0, LayerAttention(scale=0.125))
        states.append(state)
    for ours, reference in ((states[1].keys[0], states[0].keys[0]), (states[1].values[0], states[0].values[0])):
        assert ours.dtype == reference.dtype == kv_storage(kv_type, (1, 1, DH)).dtype
        assert ours.tobytes() == reference.tobytes()


@pytest.mark.parametrize("kv_type", KV_TYPES)
def test_attention_over_a_rounded_cache_is_within_the_rounding_bound(kv_type):
    """Against float64 attention over the unrounded keys and values (what float32 would hold)."""
    rng = np.random.default_rng(4)
    n, scale = 300, 0.125
    q = rng.standard_normal((n, HEADS, DH)).astype(np.float32)
    k = rng.standard_normal((n, KV_HEADS, DH)).astype(np.float32)
    v = rng.standard_normal((n, KV_HEADS, DV)).astype(np.float32)
    backend = CpuBackend(threads=2)
    state = backend.allocate_state([AttentionState(KV_HEADS, DH, DV, n, kv_type=kv_type)])
    out = np.asarray(backend.attention(q, k, v, state, 0, 0, LayerAttention(scale=scale))).reshape(n, HEADS, DV)
    keys, values = k.transpose(1, 0, 2), v.transpose(1, 0, 2)  # (Hkv, N, D), unrounded
    exact = plain_attention(q, keys, values, range(n), scale).reshape(n, HEADS, DV)
    dk, dv = rounding_bound(kv_type, keys), rounding_bound(kv_type, values)
    group = HEADS // KV_HEADS
    for h in range(HEADS):
        ds = scale * np.abs(q[:, h]) @ dk[h // group].T  # (T, N): each score's largest error
        ds = np.where(np.tril(np.ones((n, n), bool)), ds, 0.0).max(axis=1)  # over the positions each query sees
        bound = dv[h // group].max() + np.expm1(2 * ds) * np.abs(values[h // group]).max()  # (T,)
        err = np.abs(out[:, h] - exact[:, h]).max(axis=1)
        assert np.all(err <= bound + 1e-5), (
            f"{kv_type} head {h}: {err.max():.3g} over {bound[np.argmax(err - bound)]:.3g}"
        )
    if kv_type != "f32":
        assert np.abs(out - exact).max() > 1e-5  # the cache did round


@pytest.mark.parametrize("kv_type", ["f16", "q8_0"])
@pytest.mark.parametrize(
    "tier",
    [t for t in TIERS if t != "scalar"]
    or [pytest.param("none", marks=pytest.mark.skip(reason="this CPU runs only the scalar tier"))],
)
def test_every_tier_gives_the_same_bits(kv_type, tier):
    settings = SETTINGS["softcap and sinks"]
    scalar, _, _ = long_pass(kv_type, settings, 5, backend=CpuBackend(threads=2, tier="scalar"))
    other, _, _ = long_pass(kv_type, settings, 5, backend=CpuBackend(threads=2, tier=tier))
    np.testing.assert_array_equal(other.view(np.int32), scalar.view(np.int32))
