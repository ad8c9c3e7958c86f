"""The NumPy backend's ops against values worked out by hand or by naive loops."""

import math

import numpy as np
import pytest
from gguf import GGMLQuantizationType

from backends.base import AttentionState, LayerAttention, RecurrentState, WeightSpec
from backends.errors import BackendUnavailable
from backends.numpy_backend import NumpyBackend
from backends.selection import select


def f32_spec(name: str, array: np.ndarray) -> WeightSpec:
    """A weight spec over the raw bytes of a float32 array."""
    array = np.ascontiguousarray(array, dtype=np.float32)
    return WeightSpec(name, array.view(np.uint8).reshape(-1), int(GGMLQuantizationType.F32), array.shape)


def test_rms_norm_by_hand():
    be = NumpyBackend()
    x = np.array([[3.0, 4.0]], dtype=np.float32)  # mean square 12.5
    out = be.rms_norm(x, np.array([1.0, 2.0], dtype=np.float32), eps=0.0)
    expected = np.array([[3 / math.sqrt(12.5), 8 / math.sqrt(12.5)]])
    np.testing.assert_allclose(out, expected, rtol=1e-6)


@pytest.mark.parametrize("neox", [False, True])
def test_rope_rotates_the_right_pairs(neox):
    be = NumpyBackend()
    x = np.arange(1, 9, dtype=np.float32).reshape(1, 1, 8)  # (T=1, heads=1, Dh=8), rope on the first 4
    out = be.rope(x, np.array([3]), base=100.0, rope_dim=4, neox=neox)[0, 0]
    angles = [3 * 100.0 ** (-0 / 4), 3 * 100.0 ** (-2 / 4)]  # theta_i = pos * base^(-2i/d)
    pairs = [(0, 1), (2, 3)] if not neox else [(0, 2), (1, 3)]
    expected = x[0, 0].astype(np.float64).copy()
    for (a, b), angle in zip(pairs, angles):
        xa, xb = x[0, 0, a], x[0, 0, b]
        expected[a] = xa * math.cos(angle) - xb * math.sin(angle)
        expected[b] = xa * math.sin(angle) + xb * math.cos(angle)
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(out[4:], x[0, 0, 4:])  # beyond rope_dim untouched


def test_rope_freq_factors_divide_the_frequencies():
    be = NumpyBackend()
    x = np.random.default_rng(0).standard_normal((2, 3, 8)).astype(np.float32)
    pos = np.array([5, 6])
    scaled = be.rope(x, pos, 1e4, 8, True, freq_factors=np.full(4, 2.0, dtype=np.float32))
    halved_positions = be.rope(x, pos / 2.0, 1e4, 8, True)
    np.testing.assert_allclose(scaled, halved_positions, rtol=1e-5, atol=1e-6)


def naive_attention(q, keys, values, positions, scale, window=None, softcap=None, causal=True):
    """Per query, per head loop: the textbook definition with GQA by head // group; not
    `causal`, each query sees every key (within the window on either side)."""
    n_new, n_heads, _ = q.shape
    group = n_heads // keys.shape[1]
    out = np.zeros((n_new, n_heads, values.shape[2]))
    for t, pos in enumerate(positions):
        seen = range(pos + 1) if causal else range(len(keys))
        visible = [j for j in seen if window is None or abs(j - pos) < window]
        for h in range(n_heads):
            s = np.array([q[t, h] @ keys[j, h // group] * scale for j in visible], dtype=np.float64)
            if softcap:
                s = softcap * np.tanh(s / softcap)
            p = np.exp(s - s.max())
            p /= p.sum()
            out[t, h] = sum(pj * values[j, h // group] for pj, j in zip(p, visible))
    return out.reshape(n_new, -1)


@pytest.mark.parametrize("window,softcap", [(None, None), (3, None), (None, 5.0)])
def test_attention_matches_naive_loops_across_chunks(window, softcap):
    rng = np.random.default_rng(1)
    be = NumpyBackend()
    n_heads, n_kv, dh, dv, total = 4, 2, 8, 6, 7
    q = rng.standard_normal((total, n_heads, dh)).astype(np.float32)
    k = rng.standard_normal((total, n_kv, dh)).astype(np.float32)
    v = rng.standard_normal((total, n_kv, dv)).astype(np.float32)
    cache = be.allocate_state([AttentionState(n_kv, dh, dv, slots=16)] * 2)
    settings = LayerAttention(scale=0.3, window=window, softcap=softcap)
    # Prefill 4 tokens, then decode 3 one at a time, into layer 1.
    parts = [be.attention(q[:4], k[:4], v[:4], cache, 1, 0, settings)]
    parts += [be.attention(q[t:t + 1], k[t:t + 1], v[t:t + 1], cache, 1, t, settings) for t in range(4, total)]
    expected = naive_attention(q, k, v, range(total), 0.3, window, softcap)
    np.testing.assert_allclose(np.concatenate(parts), expected, rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(cache.keys[1][:, :total], k.transpose(1, 0, 2))
    assert not cache.keys[0].any(), "layer 0 must stay untouched"


@pytest.mark.parametrize("window", [None, 3])
def test_bidirectional_attention_sees_the_whole_pass(window):
    rng = np.random.default_rng(2)
    be = NumpyBackend()
    q, k = (rng.standard_normal((7, heads, 8)).astype(np.float32) for heads in (4, 2))
    v = rng.standard_normal((7, 2, 6)).astype(np.float32)
    cache = be.allocate_state([AttentionState(2, 8, 6, slots=16)])
    got = be.attention(q, k, v, cache, 0, 0, LayerAttention(scale=0.3, window=window, causal=False))
    np.testing.assert_allclose(got, naive_attention(q, k, v, range(7), 0.3, window, causal=False), rtol=1e-4, atol=1e-5)
    # the first query reads later keys: causal attention differs
    causal = naive_attention(q, k, v, range(7), 0.3, window)
    assert np.abs(got[0] - causal[0]).max() > 1e-2


def test_gated_activations_at_known_points():
    be = NumpyBackend()
    gate = np.array([1.0, -1.0, 0.0], dtype=np.float32)
    up = np.array([2.0, 2.0, 2.0], dtype=np.float32)
    # silu(x) = x * sigmoid(x); gelu_tanh(1) = 0.5 * (1 + tanh(sqrt(2/pi) * 1.044715))
    silu = [2 * 1 / (1 + math.exp(-1)), 2 * -1 / (1 + math.exp(1)), 0.0]
    gelu_1 = 0.5 * (1 + math.tanh(math.sqrt(2 / math.pi) * 1.044715))
    np.testing.assert_allclose(be.gated_activation(gate, up, "silu"), silu, rtol=1e-6)
    np.testing.assert_allclose(be.gated_activation(gate, up, "gelu_tanh"), [2 * gelu_1, 2 * (gelu_1 - 1), 0.0], rtol=1e-6)
    with pytest.raises(ValueError):
        be.gated_activation(gate, up, "relu6")


def test_linear_streams_rows_when_the_budget_is_spent():
    rng = np.random.default_rng(2)
    w = rng.standard_normal((300, 40)).astype(np.float32)
    x = rng.standard_normal((3, 40)).astype(np.float32)
    cached = NumpyBackend(memory_budget_bytes=1 << 30)
    starved = NumpyBackend(memory_budget_bytes=0)
    for be in (cached, starved):
        np.testing.assert_allclose(be.linear(x, be.prepare_weight(f32_spec("w", w))), x @ w.T, rtol=1e-5, atol=1e-5)
    assert cached.cache.used_bytes == w.nbytes
    assert starved.cache.used_bytes == 0


def test_joined_projections_give_each_product_and_share_the_cache():
    rng = np.random.default_rng(3)
    shapes = [(12, 8), (4, 8), (6, 8)]  # q, k, v of different widths on one input
    ws = [rng.standard_normal(shape).astype(np.float32) for shape in shapes]
    biases = (rng.standard_normal(12).astype(np.float32), None, rng.standard_normal(6).astype(np.float32))
    x = rng.standard_normal((3, 8)).astype(np.float32)
    be = NumpyBackend(memory_budget_bytes=1 << 30)
    prepared = [be.prepare_weight(f32_spec(name, w)) for name, w in zip("qkv", ws)]
    used = be.cache.used_bytes
    joined = be.fuse_linear(prepared)
    outs = be.linear_fused(x, joined, biases)
    for out, w, b in zip(outs, ws, biases):
        np.testing.assert_allclose(out, x @ w.T + (0 if b is None else b), rtol=1e-5, atol=1e-5)
    assert be.cache.used_bytes == used  # joined, not copied twice
    assert all(np.shares_memory(be.cache.peek(name), joined.matrix) for name in "qkv")
    np.testing.assert_allclose(be.linear(x, prepared[1]), x @ ws[1].T, rtol=1e-5, atol=1e-5)  # still usable alone


def test_streamed_projections_stay_apart_and_still_multiply():
    rng = np.random.default_rng(4)
    ws = [rng.standard_normal((5, 8)).astype(np.float32) for _ in range(2)]
    x = rng.standard_normal((2, 8)).astype(np.float32)
    be = NumpyBackend(memory_budget_bytes=ws[0].nbytes)  # room for the first only
    joined = be.fuse_linear([be.prepare_weight(f32_spec(name, w)) for name, w in zip("gu", ws)])
    assert isinstance(joined, tuple)
    for out, w in zip(be.linear_fused(x, joined, (None, None)), ws):
        np.testing.assert_allclose(out, x @ w.T, rtol=1e-5, atol=1e-5)


def test_embedding_reads_rows_and_scales():
    table = np.arange(12, dtype=np.float32).reshape(4, 3)
    be = NumpyBackend(memory_budget_bytes=0)
    out = be.embedding(be.prepare_weight(f32_spec("emb", table)), np.array([3, 0]), scale=2.0)
    np.testing.assert_array_equal(out, [[18, 20, 22], [0, 2, 4]])


def test_state_size():
    be = NumpyBackend()
    state = be.allocate_state([AttentionState(2, 4, 5, slots=10)] * 3 + [RecurrentState(((3, 4), (7,)))])
    assert be.state_bytes(state) == 3 * 10 * 2 * (4 + 5) * 4 + (12 + 7) * 4


def test_select_numpy_gives_numpy_and_says_why_not_the_others():
    backend, reasons = select("numpy")
    assert backend.name == "numpy"
    assert [r.split(":")[0] for r in reasons] == ["cuda", "mlx", "cpu"]
    assert "cpu: not chosen (the numpy backend was asked for)" in reasons


def test_select_explicit_unavailable_backend_says_why():
    with pytest.raises(BackendUnavailable, match="cuda: "):
        select("cuda")
    with pytest.raises(BackendUnavailable, match="unknown backend"):
        select("tpu")


def test_prepare_weight_dequantizes_while_the_budget_lasts():
    w = np.ones((8, 4), dtype=np.float32)
    be = NumpyBackend(memory_budget_bytes=w.nbytes)
    be.prepare_weight(f32_spec("first", w))
    assert be.cache.peek("first") is not None  # dequantized at load time, before any product
    be.prepare_weight(f32_spec("second", w))
    assert be.cache.peek("second") is None  # over budget: left to be streamed
