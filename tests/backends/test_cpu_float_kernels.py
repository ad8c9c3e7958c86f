"""The native CPU kernels' float ops: exp, attention and gated activations.

- The vectorized exp (exp8, used by the softmax and the gated activations) is within 2 ulp
  of float64 exp (NumPy) over the float range, exact at 0, and maps -inf to 0 (a masked
  score), +inf to inf and nan to nan, the same bits in every tier.
- Attention over the KV cache matches the textbook loops (float64) for grouped-query heads
  (3 or 4 query heads per KV head), sliding windows and soft-capping, for passes of 1..16
  tokens on 1-3 threads; a token's output is the same bits whatever tokens share its pass.
- SiLU and GELU-tanh gated activations match float64 formulas.
"""

import importlib
import math

import numpy as np
import pytest

from backends import cpu_native
from backends.base import AttentionState, LayerAttention
from backends.cpu_backend import CpuBackend
from tests.backends.test_numpy_backend import naive_attention

TIERS = cpu_native.runnable_tiers()
ULP = 2.0 ** -23  # float32 spacing at 1; half of it is the unit roundoff


def kernel_exp(tier: str, x: np.ndarray) -> np.ndarray:
    module = importlib.import_module(f"backends._cpu_{tier}")
    return np.frombuffer(module.exp(np.ascontiguousarray(x, dtype=np.float32)), dtype=np.float32)


def test_exp_is_within_two_ulp_of_float64_exp():
    x = np.linspace(-87.0, 88.7, 1_000_003, dtype=np.float32)  # every result normal
    got = kernel_exp("scalar", x).astype(np.float64)
    reference = np.exp(x.astype(np.float64))
    worst = np.max(np.abs(got - reference) / reference)
    # measured: 8.0e-8 (1.35 units of roundoff 2^-24)
    assert worst < ULP, f"max relative error {worst:.3g}"


def test_exp_special_values():
    x = np.array([0.0, -0.0, -np.inf, np.inf, np.nan, -200.0, 200.0, 89.0, -104.0, 1e-30], dtype=np.float32)
    got = kernel_exp("scalar", x)
    assert got[0] == 1.0 and got[1] == 1.0, "exp(0) must be exactly 1"
    assert got[2] == 0.0 and got[5] == 0.0 and got[8] == 0.0
    assert np.isposinf(got[3]) and np.isposinf(got[6]) and np.isposinf(got[7])
    assert np.isnan(got[4])
    assert got[9] == 1.0
    subnormal = np.array([-100.0, -95.5, -88.0], dtype=np.float32)
    # within one subnormal step (2^-149) plus 2 ulp of float64 exp
    np.testing.assert_allclose(kernel_exp("scalar", subnormal), np.exp(subnormal.astype(np.float64)), rtol=ULP, atol=2.0 ** -149)


@pytest.mark.parametrize("tier", [t for t in TIERS if t != "scalar"] or
                         [pytest.param("none", marks=pytest.mark.skip(reason="this CPU runs only the scalar tier"))])
def test_exp_is_the_same_in_every_tier(tier):
    x = np.random.default_rng(3).uniform(-110.0, 90.0, 100_005).astype(np.float32)
    np.testing.assert_array_equal(kernel_exp(tier, x).view(np.int32), kernel_exp("scalar", x).view(np.int32))


def attention_pass(be, q, k, v, cache, start, settings):
    return np.array(be.attention(q, k, v, cache, 0, start, settings))


@pytest.mark.parametrize("heads,kv_heads", [(9, 3), (4, 1), (2, 2)])
@pytest.mark.parametrize("window,softcap", [(None, None), (5, None), (None, 4.0)])
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_attention_matches_the_textbook_loops(heads, kv_heads, window, softcap, threads):
    rng = np.random.default_rng(heads * 10 + threads)
    dh, dv, prefix, total = 64, 48, 21, 21 + 1 + 16
    q = rng.standard_normal((total, heads, dh)).astype(np.float32)
    k = rng.standard_normal((total, kv_heads, dh)).astype(np.float32)
    v = rng.standard_normal((total, kv_heads, dv)).astype(np.float32)
    settings = LayerAttention(scale=0.125, window=window, softcap=softcap)
    be = CpuBackend(threads=threads)
    cache = be.allocate_state([AttentionState(kv_heads, dh, dv, slots=64)])
    parts = [attention_pass(be, q[:prefix], k[:prefix], v[:prefix], cache, 0, settings)]  # prefill
    parts.append(attention_pass(be, q[prefix:prefix + 1], k[prefix:prefix + 1], v[prefix:prefix + 1], cache, prefix, settings))
    parts.append(attention_pass(be, q[prefix + 1:], k[prefix + 1:], v[prefix + 1:], cache, prefix + 1, settings))  # 16
    expected = naive_attention(q, k, v, range(total), 0.125, window, softcap)
    np.testing.assert_allclose(np.concatenate(parts), expected, rtol=1e-4, atol=1e-5)
    be.close()


@pytest.mark.parametrize("window", [None, 5])
def test_bidirectional_attention_matches_the_textbook_loops(window):
    rng = np.random.default_rng(7)
    heads, kv_heads, dh, dv, total = 4, 2, 64, 48, 19
    q = rng.standard_normal((total, heads, dh)).astype(np.float32)
    k = rng.standard_normal((total, kv_heads, dh)).astype(np.float32)
    v = rng.standard_normal((total, kv_heads, dv)).astype(np.float32)
    be = CpuBackend(threads=2)
    cache = be.allocate_state([AttentionState(kv_heads, dh, dv, slots=32)])
    got = attention_pass(be, q, k, v, cache, 0, LayerAttention(scale=0.125, window=window, causal=False))
    expected = naive_attention(q, k, v, range(total), 0.125, window, causal=False)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)
    be.close()


@pytest.mark.parametrize("n_tokens", [2, 4, 16])
def test_a_tokens_attention_does_not_depend_on_its_pass(n_tokens):
    """Verifying T drafted tokens in one pass gives each the bits it gets alone."""
    rng = np.random.default_rng(n_tokens)
    heads, kv_heads, dh, dv, prefix = 9, 3, 64, 64, 30
    total = prefix + n_tokens
    q = rng.standard_normal((total, heads, dh)).astype(np.float32)
    k = rng.standard_normal((total, kv_heads, dh)).astype(np.float32)
    v = rng.standard_normal((total, kv_heads, dv)).astype(np.float32)
    settings = LayerAttention(scale=0.125, window=None, softcap=None)
    be = CpuBackend(threads=2)
    together = be.allocate_state([AttentionState(kv_heads, dh, dv, slots=64)])
    alone = be.allocate_state([AttentionState(kv_heads, dh, dv, slots=64)])
    for cache in (together, alone):
        attention_pass(be, q[:prefix], k[:prefix], v[:prefix], cache, 0, settings)
    one_pass = attention_pass(be, q[prefix:], k[prefix:], v[prefix:], together, prefix, settings)
    one_by_one = [attention_pass(be, q[t:t + 1], k[t:t + 1], v[t:t + 1], alone, t, settings) for t in range(prefix, total)]
    np.testing.assert_array_equal(one_pass, np.concatenate(one_by_one))
    be.close()


def test_gated_activations_match_float64_formulas():
    rng = np.random.default_rng(5)
    gate = np.concatenate([rng.standard_normal(1001) * 6, [0.0, 30.0, -30.0, 100.0, -100.0]]).astype(np.float32)
    up = rng.standard_normal(gate.size).astype(np.float32)
    g, u = gate.astype(np.float64), up.astype(np.float64)
    silu = g / (1 + np.exp(-g)) * u
    gelu = 0.5 * g * (1 + np.tanh(math.sqrt(2 / math.pi) * (g + 0.044715 * g ** 3))) * u
    be = CpuBackend(threads=2)
    np.testing.assert_allclose(np.array(be.gated_activation(gate, up, "silu")), silu, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.array(be.gated_activation(gate, up, "gelu_tanh")), gelu, rtol=1e-5, atol=1e-6)
    be.close()


def test_rope_of_every_position_of_a_pass_after_other_shapes():
    """The kernel caches the cos/sin of every position of the last pass; a pass of another
    length, rotary width or positions must get its own (here after a wide one-token pass, a
    narrow pass over more tokens, which needs more positions than the cache held)."""
    rng = np.random.default_rng(2)
    be = CpuBackend(threads=1)
    be.rope(rng.standard_normal((1, 2, 64)).astype(np.float32), np.array([3]), 10000.0, 64, True)
    x = rng.standard_normal((40, 2, 8)).astype(np.float32)
    positions = np.arange(11, 51)
    for rope_dim in (8, 2):
        ours = np.array(be.rope(x, positions, 500.0, rope_dim, True))
        half = rope_dim // 2
        angles = positions[:, None, None] * 500.0 ** (-2 * np.arange(half) / rope_dim)  # theta_i = pos * base^(-2i/d)
        a, b = x[:, :, :half].astype(np.float64), x[:, :, half:rope_dim].astype(np.float64)
        rotated = np.concatenate([a * np.cos(angles) - b * np.sin(angles), a * np.sin(angles) + b * np.cos(angles)], -1)
        np.testing.assert_allclose(ours[:, :, :rope_dim], rotated, rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(ours[:, :, rope_dim:], x[:, :, rope_dim:])
    be.close()
