"""The MLX backend's ops against the NumPy reference backend, on random inputs.

Tolerances, by where the two may differ:
- quantized embedding rows: none. Both dequantize the same blocks exactly (see
  test_mlx_quantize.py) and scale them the same way;
- float32 arithmetic in another order (matrix products, norms, attention): 1e-5 of the
  sum of the magnitudes that went into each result (or 1e-5 relative for elementwise ops);
- float16 matrices (types without an exact affine form, but F32): both the weights and
  the inputs are rounded to float16, 2**-11 relative each, so 2e-3 of the sum of magnitudes.
"""

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from backends.base import AttentionState, LayerAttention, RecurrentState, WeightSpec
from backends.errors import BackendUnavailable
from backends.numpy_backend import NumpyBackend
from tests.backends.test_mlx_quantize import random_blocks

mx = pytest.importorskip("mlx.core", reason="mlx is not installed (pip install 'sprig[mlx]')")

from backends import selection  # noqa: E402  (after the skip: selecting MLX imports it)
from backends.mlx_backend import MLXBackend, QuantizedMatrix, StepStart  # noqa: E402

AFFINE = [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q4_K, T.Q5_K, T.Q1_0]
EXACT = AFFINE + [T.F32]  # held with their values unchanged
HALF = [T.F16, T.Q6_K, T.Q3_K]  # held as float16
FLOAT32_TOLERANCE = 1e-5
FLOAT16_TOLERANCE = 2e-3


@pytest.fixture(scope="module")
def mlx_backend():
    return MLXBackend()


@pytest.fixture(scope="module")
def numpy_backend():
    return NumpyBackend()


def spec(qtype: T, shape: tuple[int, int], seed: int) -> WeightSpec:
    """A random weight of `qtype`: gguf-py's blocks, or random blocks with small fp16 scales.

    Names differ, since the NumPy backend caches dequantized matrices by name.
    """
    rng = np.random.default_rng(seed)
    name = f"{qtype.name}-{shape}-{seed}"
    if qtype in (T.F32, T.F16):
        values = rng.standard_normal(shape).astype(np.float32 if qtype == T.F32 else np.float16)
        return WeightSpec(name, values.view(np.uint8).reshape(-1), int(qtype), shape)
    return WeightSpec(name, random_blocks(qtype, shape, rng, scale=0.01), int(qtype), shape)


def host(x) -> np.ndarray:
    return np.array(x)


def assert_close_to_sum_of_magnitudes(ours, reference, magnitudes, tolerance):
    """|ours - reference| <= tolerance * the sum of |terms| each result came from."""
    excess = np.abs(np.asarray(ours, dtype=np.float64) - reference) - tolerance * magnitudes
    assert excess.max() <= 0, f"worst excess {excess.max():.3g} over the tolerance"


@pytest.mark.parametrize("qtype", EXACT + HALF, ids=lambda t: t.name)
def test_linear_matches_numpy_for_each_weight_type(qtype, mlx_backend, numpy_backend):
    weight_spec = spec(qtype, (48, 256), int(qtype))
    x = np.random.default_rng(1).standard_normal((3, 256)).astype(np.float32)
    bias = np.random.default_rng(2).standard_normal(48).astype(np.float32)
    ours = mlx_backend.linear(mx.array(x), mlx_backend.prepare_weight(weight_spec), mx.array(bias))
    reference = numpy_backend.linear(x, numpy_backend.prepare_weight(weight_spec), bias)
    w = numpy_backend.prepare_weight(weight_spec).rows(np.arange(48))  # (48, 256) float32
    tolerance = FLOAT32_TOLERANCE if qtype in EXACT else FLOAT16_TOLERANCE
    assert_close_to_sum_of_magnitudes(host(ours), reference, np.abs(x) @ np.abs(w).T + np.abs(bias), tolerance)


@pytest.mark.parametrize("qtype", EXACT + HALF, ids=lambda t: t.name)
def test_embedding_matches_numpy_for_each_weight_type(qtype, mlx_backend, numpy_backend):
    weight_spec = spec(qtype, (40, 256), int(qtype) + 100)
    ids = np.array([39, 0, 7, 7])
    ours = host(mlx_backend.embedding(mlx_backend.prepare_weight(weight_spec), ids, scale=3.0))
    reference = numpy_backend.embedding(numpy_backend.prepare_weight(weight_spec), ids, scale=3.0)
    if qtype in EXACT:
        np.testing.assert_array_equal(ours, reference)
    else:
        np.testing.assert_allclose(ours, reference, rtol=2.0 ** -11, atol=2.0 ** -24)  # float16, subnormals too


def test_prepared_forms(mlx_backend):
    q1 = mlx_backend.prepare_weight(spec(T.Q1_0, (8, 256), 0))
    assert isinstance(q1, QuantizedMatrix) and (q1.group_size, q1.bits) == (128, 1 if mlx_backend.one_bit else 2)
    assert mlx_backend.prepare_weight(spec(T.Q6_K, (8, 256), 0)).values.dtype == mx.float16
    assert mlx_backend.prepare_weight(spec(T.F32, (8, 256), 0)).values.dtype == mx.float32
    norm = np.linspace(0.5, 2.0, 256, dtype=np.float32)
    prepared = mlx_backend.prepare_weight(WeightSpec("n", norm.view(np.uint8), int(T.F32), (256,)))
    assert prepared.dtype == mx.float32 and np.array_equal(host(prepared), norm)


def test_q1_0_two_bit_fallback_multiplies_the_same(numpy_backend):
    """The form used where MLX lacks 1-bit kernels (probed at start-up) must give the same products."""
    two_bit = MLXBackend()
    two_bit.one_bit = False
    weight_spec = spec(T.Q1_0, (16, 384), 5)
    prepared = two_bit.prepare_weight(weight_spec)
    assert prepared.bits == 2
    x = np.random.default_rng(6).standard_normal((2, 384)).astype(np.float32)
    w = numpy_backend.prepare_weight(weight_spec).rows(np.arange(16))
    assert_close_to_sum_of_magnitudes(host(two_bit.linear(mx.array(x), prepared)), x @ w.T,
                                      np.abs(x) @ np.abs(w).T, FLOAT32_TOLERANCE)


@pytest.mark.parametrize("shape", [(5, 64), (5, 4, 16)])
def test_rms_norm_matches_numpy(shape, mlx_backend, numpy_backend):
    rng = np.random.default_rng(7)
    x = (10 * rng.standard_normal(shape)).astype(np.float32)
    weight = rng.standard_normal(shape[-1]).astype(np.float32)
    np.testing.assert_allclose(host(mlx_backend.rms_norm(mx.array(x), mx.array(weight), 1e-6)),
                               numpy_backend.rms_norm(x, weight, 1e-6), rtol=FLOAT32_TOLERANCE, atol=1e-6)


@pytest.mark.parametrize("neox", [False, True])
@pytest.mark.parametrize("rope_dim,factors", [(16, None), (8, None), (16, np.array([1, 2, 4, 8, 8, 8, 16, 32]))])
def test_rope_matches_numpy(neox, rope_dim, factors, mlx_backend, numpy_backend):
    x = np.random.default_rng(8).standard_normal((3, 2, 16)).astype(np.float32)
    positions = np.arange(37, 40)  # a chunk that does not start at 0
    freq_factors = None if factors is None else factors[: rope_dim // 2].astype(np.float32)
    ours = mlx_backend.rope(mx.array(x), positions, 1e4, rope_dim, neox, freq_factors)
    reference = numpy_backend.rope(x, positions, 1e4, rope_dim, neox, freq_factors)
    np.testing.assert_allclose(host(ours), reference, rtol=1e-4, atol=1e-5)  # float32 angles of ~40 rad
    np.testing.assert_array_equal(host(ours)[..., rope_dim:], x[..., rope_dim:])


def test_rope_refuses_positions_that_are_not_consecutive(mlx_backend):
    with pytest.raises(ValueError, match="consecutive"):
        mlx_backend.rope(mx.zeros((2, 1, 8)), np.array([3, 5]), 1e4, 8, True)


ATTENTION_CASES = [(None, None), (3, None), (None, 5.0), (3, 5.0)]


def attention_inputs(seed: int = 9):
    """Queries (7, 4 heads, 8), keys (7, 2 kv heads, 8), values (7, 2, 6): grouped-query attention."""
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((7, heads, dim)).astype(np.float32) for heads, dim in ((4, 8), (2, 8), (2, 6))]


@pytest.mark.parametrize("window,softcap", ATTENTION_CASES)
def test_attention_prefill_then_decode_matches_numpy(window, softcap, mlx_backend, numpy_backend):
    """A prefill chunk of 4 at position 2, then 3 decode steps, into layer 1 of both caches."""
    q, k, v = attention_inputs()
    settings = LayerAttention(scale=0.3, window=window, softcap=softcap)
    ours, reference = [], []
    for be, out, wrap in ((mlx_backend, ours, mx.array), (numpy_backend, reference, np.asarray)):
        cache = be.allocate_state([AttentionState(2, 8, 6, slots=16)] * 2)
        out.append(be.attention(wrap(q[:4]), wrap(k[:4]), wrap(v[:4]), cache, 1, 2, settings))
        for t in range(4, 7):
            out.append(be.attention(wrap(q[t:t + 1]), wrap(k[t:t + 1]), wrap(v[t:t + 1]), cache, 1, t + 2, settings))
        if be is mlx_backend:
            ours_keys = host(cache.arrays[1][0][0])  # (Hkv, N, Dh)
        else:
            reference_keys = cache.keys[1]
    np.testing.assert_allclose(np.concatenate([host(o) for o in ours]), np.concatenate(reference),
                               rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(ours_keys, reference_keys)


@pytest.mark.parametrize("window", [None, 3])
def test_bidirectional_attention_matches_numpy(window, mlx_backend, numpy_backend):
    q, k, v = attention_inputs(11)
    settings = LayerAttention(scale=0.3, window=window, causal=False)
    outs = []
    for be, wrap in ((mlx_backend, mx.array), (numpy_backend, np.asarray)):
        cache = be.allocate_state([AttentionState(2, 8, 6, slots=16)])
        outs.append(host(be.attention(wrap(q), wrap(k), wrap(v), cache, 0, 0, settings)))
    np.testing.assert_allclose(outs[0], outs[1], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("window,softcap", ATTENTION_CASES)
@pytest.mark.parametrize("span", [16, 32])
def test_attention_of_a_compiled_step_reads_a_fixed_span(window, softcap, span, mlx_backend, numpy_backend):
    """With a StepStart, the step reads `span` positions (or just the window) and masks by position."""
    q, k, v = attention_inputs(10)
    settings = LayerAttention(scale=0.3, window=window, softcap=softcap)
    ours_cache = mlx_backend.allocate_state([AttentionState(2, 8, 6, slots=32)])
    reference_cache = numpy_backend.allocate_state([AttentionState(2, 8, 6, slots=32)])
    for t in range(7):
        start = StepStart(mx.array([t + 5], dtype=mx.int32), span)
        ours = mlx_backend.attention(mx.array(q[t:t + 1]), mx.array(k[t:t + 1]), mx.array(v[t:t + 1]),
                                     ours_cache, 0, start, settings)
        reference = numpy_backend.attention(q[t:t + 1], k[t:t + 1], v[t:t + 1], reference_cache, 0, t + 5, settings)
        np.testing.assert_allclose(host(ours), reference, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("softcap", [None, 5.0])
def test_a_ring_layer_matches_a_full_length_one_eager_and_compiled(softcap, mlx_backend, numpy_backend):
    """A ring of 5 slots with a window of 3 (passes of up to 3 tokens): a prefill chunk of 3,
    then passes of 2, then compiled one-token steps (StepStart), against NumPy's full-length
    layer; the compiled step writes the ring through mx.compile's captured state."""
    rng = np.random.default_rng(14)
    q, k, v = (rng.standard_normal((20, heads, dim)).astype(np.float32) for heads, dim in ((4, 8), (2, 8), (2, 6)))
    settings = LayerAttention(scale=0.3, window=3, softcap=softcap)
    ring = mlx_backend.allocate_state([AttentionState(2, 8, 6, slots=5, window=3)])
    full = numpy_backend.allocate_state([AttentionState(2, 8, 6, slots=20)])
    ours, reference = [], []
    for start, end in ((0, 3), (3, 5), (5, 7), (7, 9)):
        ours.append(mlx_backend.attention(mx.array(q[start:end]), mx.array(k[start:end]), mx.array(v[start:end]),
                                          ring, 0, start, settings))
        reference.append(numpy_backend.attention(q[start:end], k[start:end], v[start:end], full, 0, start, settings))

    def step(q1, k1, v1, position):
        return mlx_backend.attention(q1, k1, v1, ring, 0, StepStart(position, 16), settings)

    compiled = mx.compile(step, inputs=ring.state, outputs=ring.state)
    for t in range(9, 20):
        ours.append(compiled(mx.array(q[t:t + 1]), mx.array(k[t:t + 1]), mx.array(v[t:t + 1]),
                             mx.array([t], dtype=mx.int32)))
        reference.append(numpy_backend.attention(q[t:t + 1], k[t:t + 1], v[t:t + 1], full, 0, t, settings))
    np.testing.assert_allclose(np.concatenate([host(o) for o in ours]), np.concatenate(reference),
                               rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="split it"):
        mlx_backend.attention(mx.array(q[:4]), mx.array(k[:4]), mx.array(v[:4]), ring, 0, 0, settings)


@pytest.mark.parametrize("kind", ["silu", "gelu_tanh"])
def test_gated_activations_match_numpy(kind, mlx_backend, numpy_backend):
    rng = np.random.default_rng(11)
    gate, up = (4 * rng.standard_normal((3, 50))).astype(np.float32), rng.standard_normal((3, 50)).astype(np.float32)
    np.testing.assert_allclose(host(mlx_backend.gated_activation(mx.array(gate), mx.array(up), kind)),
                               numpy_backend.gated_activation(gate, up, kind), rtol=1e-5, atol=1e-6)


def test_unknown_activation(mlx_backend):
    with pytest.raises(ValueError, match="unknown activation"):
        mlx_backend.gated_activation(mx.zeros(2), mx.zeros(2), "relu6")


def test_add_softcap_and_to_host_match_numpy(mlx_backend, numpy_backend):
    rng = np.random.default_rng(12)
    a, b = (50 * rng.standard_normal((2, 30))).astype(np.float32), rng.standard_normal((2, 30)).astype(np.float32)
    np.testing.assert_array_equal(host(mlx_backend.add(mx.array(a), mx.array(b))), numpy_backend.add(a, b))
    capped = mlx_backend.to_host(mlx_backend.softcap(mx.array(a), 30.0))
    assert capped.dtype == np.float32
    np.testing.assert_allclose(capped, numpy_backend.softcap(a, 30.0), rtol=FLOAT32_TOLERANCE, atol=1e-5)


def test_argmax_stays_on_the_device(mlx_backend):
    logits = np.random.default_rng(13).standard_normal((3, 1000)).astype(np.float32)
    token = mlx_backend.argmax(mx.array(logits))
    assert isinstance(token, mx.array) and token.shape == (1,) and token.dtype == mx.int32
    assert token.item() == int(np.argmax(logits[-1]))


def test_state_size(mlx_backend):
    state = mlx_backend.allocate_state([AttentionState(2, 4, 5, slots=10)] * 3 + [RecurrentState(((3, 4), (7,)))])
    assert mlx_backend.state_bytes(state) == 3 * 10 * 2 * (4 + 5) * 4 + (12 + 7) * 4


def test_state_arrays_are_host_copies_that_load_back(mlx_backend):
    state = mlx_backend.allocate_state([AttentionState(2, 4, 5, slots=10), RecurrentState(((3, 4), (7,)))])
    arrays = mlx_backend.state_arrays(state)
    assert [a.shape for a in arrays] == [(1, 2, 10, 4), (1, 2, 10, 5), (3, 4), (7,)]
    rng = np.random.default_rng(14)
    for array in arrays:
        array[...] = rng.standard_normal(array.shape)
    mlx_backend.load_state_arrays(state, arrays)
    assert all(np.array_equal(a, b) for a, b in zip(mlx_backend.state_arrays(state), arrays, strict=True))


def test_device_name_says_mlx_and_the_device(mlx_backend):
    expected = "Apple GPU" if mx.default_device().type == mx.gpu else "CPU"
    assert mlx_backend.device_name.startswith(expected) and "MLX" in mlx_backend.device_name


# -- selection -------------------------------------------------------------------------


def test_auto_picks_mlx_on_apple_silicon(monkeypatch):
    monkeypatch.setattr(selection, "_is_apple_silicon", lambda: True)
    backend, reasons = selection.select("auto")
    assert backend.name == "mlx" and [r.split(":")[0] for r in reasons] == ["cuda"]


def test_auto_passes_mlx_over_elsewhere_and_says_why(monkeypatch):
    monkeypatch.setattr(selection, "_is_apple_silicon", lambda: False)
    backend, reasons = selection.select("auto")
    assert backend.name == "cpu"  # the native kernels: where MLX would compute on the CPU anyway
    assert any(r.startswith("mlx: not Apple silicon (") for r in reasons)


def test_mlx_when_asked_for_runs_anywhere(monkeypatch):
    monkeypatch.setattr(selection, "_is_apple_silicon", lambda: False)
    backend, reasons = selection.select("mlx")
    assert isinstance(backend, MLXBackend) and any(r.startswith("cuda:") for r in reasons)


def test_mlx_asked_for_but_not_installed(monkeypatch):
    real_find_spec = selection.importlib.util.find_spec
    monkeypatch.setattr(selection.importlib.util, "find_spec",
                        lambda name, *args: None if name == "mlx" else real_find_spec(name, *args))
    with pytest.raises(BackendUnavailable, match="mlx: the mlx package is not installed"):
        selection.select("mlx")
    backend, reasons = selection.select("auto")
    assert backend.name == "cpu" and any("mlx package is not installed" in r for r in reasons)


def test_a_float16_cache_holds_the_numpy_rounding(mlx_backend, numpy_backend):
    """Keys and values stored as float16 (rounded to nearest even on both), read exactly:
    the outputs agree as float32 attention over the same values does."""
    q, k, v = attention_inputs(15)
    settings = LayerAttention(scale=0.3)
    layers = [AttentionState(2, 8, 6, slots=16, kv_type="f16")]
    ours_cache, reference_cache = mlx_backend.allocate_state(layers), numpy_backend.allocate_state(layers)
    ours = mlx_backend.attention(mx.array(q), mx.array(k), mx.array(v), ours_cache, 0, 0, settings)
    reference = numpy_backend.attention(q, k, v, reference_cache, 0, 0, settings)
    np.testing.assert_allclose(host(ours), reference, rtol=1e-5, atol=1e-5)
    stored = np.array(ours_cache.arrays[0][0][0])  # (Hkv, N, Dh)
    assert stored.dtype == np.float16
    np.testing.assert_array_equal(stored, reference_cache.keys[0])
    assert "q8_0" not in mlx_backend.kv_types  # a model asking for it keeps float16, with a load note
