"""The CUDA product kernels (`backends/cuda/kernels/products.cu`) on the CPU emulator, against
gguf-py's dequantizer and NumPy products.

Weights are random valid blocks: random bytes with their fp16 scales replaced by sane values.
Q1_0, which gguf-py cannot dequantize, is worked out here from its rule (bit 1 -> +d, 0 -> -d).
The mat-vec kernels' activation codes are modelled here in NumPy from their rules, for both
precisions: "fast" (one 8-bit code per value) and "precise" (two: 15 bits).
"""

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, quants
from gguf import GGMLQuantizationType as T

from backends.base import WeightSpec
from backends.cuda.products import IN_PLACE_TYPES, SMALL_BATCH, DeviceMatrix, Products, join_matrices, upload_matrix

emulator_device = pytest.importorskip("backends.cuda.emulator_device", reason="the CUDA emulator is not there")

# Byte offsets of each block's fp16 scale fields (d, and m / dmin where the format has one).
_HALF_FIELDS = {
    T.Q4_0: (0,),
    T.Q4_1: (0, 2),
    T.Q5_0: (0,),
    T.Q5_1: (0, 2),
    T.Q8_0: (0,),
    T.Q1_0: (0,),
    T.Q4_K: (0, 2),
    T.Q5_K: (0, 2),
    T.Q6_K: (208,),
    T.Q3_K: (108,),
    T.IQ4_NL: (0,),
}
# Row widths: more than 32 sub-blocks of 32 (lanes loop), an odd number where the block allows.
_COLS = {T.Q1_0: 1152, T.Q4_K: 1280, T.Q5_K: 1280, T.Q6_K: 1280, T.F32: 1056, T.F16: 1056, T.BF16: 1056}
_ROWS = 70  # not a multiple of 4 (rows per mat-vec block) nor 64 (GEMM tile)
_TOKENS = (1, 2, 3, 8, 16, 17, 40)
_TYPES = sorted(IN_PLACE_TYPES)
_QUANTIZED_TYPES = [t for t in _TYPES if t not in (T.F32, T.F16, T.BF16)]
_RADIX = 254  # d1 / d2 of the precise mode's two codes
_PRECISE_LEVELS = 127 * _RADIX  # max|x| of a 32-value block maps to this 15-bit code


@pytest.fixture(scope="module")
def dev(device):
    """The device of this run (the emulator, then a GPU where one runs: conftest.py)."""
    return device


@pytest.fixture(scope="module")
def products(dev):
    return Products(dev)  # precision "precise", the default


@pytest.fixture(scope="module")
def fast_products(dev):
    return Products(dev, precision="fast")


def random_weights(ggml_type: int, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """(rows, row bytes) uint8: random blocks of `ggml_type` with sane fp16 scales."""
    if ggml_type == T.F32:
        return rng.normal(0, 0.1, (rows, cols)).astype(np.float32).view(np.uint8)
    if ggml_type == T.F16:
        return rng.normal(0, 0.1, (rows, cols)).astype(np.float16).view(np.uint8)
    if ggml_type == T.BF16:
        top = rng.normal(0, 0.1, (rows, cols)).astype(np.float32).view(np.uint32) >> 16
        return top.astype(np.uint16).view(np.uint8)
    per_block, block_bytes = GGML_QUANT_SIZES[T(ggml_type)]
    blocks = rng.integers(0, 256, (rows * cols // per_block, block_bytes), dtype=np.uint8)
    for offset in _HALF_FIELDS[T(ggml_type)]:
        scale = rng.uniform(-0.02, 0.02, len(blocks)).astype(np.float16)
        blocks[:, offset : offset + 2] = scale.view(np.uint8).reshape(-1, 2)  # (n_blocks, 2)
    return blocks.reshape(rows, -1)  # (rows, row bytes)


def reference_dequantize(raw: np.ndarray, ggml_type: int, rows: int, cols: int) -> np.ndarray:
    """(rows, cols) float32 by gguf-py, or by the Q1_0 rule worked out here."""
    if ggml_type != T.Q1_0:
        return quants.dequantize(raw, T(ggml_type)).reshape(rows, cols)  # (rows, cols)
    blocks = raw.reshape(-1, 18)  # (n_blocks, 18)
    d = blocks[:, :2].copy().view(np.float16).astype(np.float32)  # (n_blocks, 1)
    bits = np.unpackbits(blocks[:, 2:], axis=1, bitorder="little")  # (n_blocks, 128)
    return np.where(bits == 1, d, -d).reshape(rows, cols)  # (rows, cols)


def quantized_activations(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The 8-bit activations by their rule: per 32 values d = max|x| / 127, q = rint(x / d).
    Returns codes (T, cols) int8, scales (T, cols / 32) fp16 and sums (T, cols / 32) int."""
    blocks = x.reshape(x.shape[0], -1, 32)  # (T, cols / 32, 32)
    d = (np.abs(blocks).max(axis=-1) / np.float32(127)).astype(np.float32)  # (T, cols / 32)
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(d[..., None] > 0, np.rint(blocks / d[..., None]), 0).astype(np.int8)  # (T, cols / 32, 32)
    return q.reshape(x.shape), d.astype(np.float16), q.astype(np.int64).sum(axis=-1)


def precise_activations(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The two-code activations by their rule: per 32 values d2 = max|x| / (127 * 254) in
    float32, Q = rint(x / d2), q1 = Q / 254 to the nearest (halves down), q2 = Q - 254 q1.
    Returns codes (T, cols / 32, 2, 32) int8 (q1 then q2), d2 (T, cols / 32) float32 and the
    sums of Q (T, cols / 32) int."""
    blocks = x.reshape(x.shape[0], -1, 32)  # (T, cols / 32, 32)
    d2 = np.abs(blocks).max(axis=-1) / np.float32(_PRECISE_LEVELS)  # (T, cols / 32) float32
    with np.errstate(divide="ignore", invalid="ignore"):
        q15 = np.where(d2[..., None] > 0, np.rint(blocks / d2[..., None]), 0).astype(np.int64)  # (T, cols / 32, 32)
    q1 = np.floor_divide(q15 + _RADIX // 2, _RADIX)
    q2 = q15 - _RADIX * q1
    assert np.abs(q1).max(initial=0) <= 127 and np.abs(q2).max(initial=0) <= 127
    return np.stack([q1, q2], axis=-2).astype(np.int8), d2, q15.sum(axis=-1)  # codes (T, cols / 32, 2, 32)


def dequantized_activations(x: np.ndarray, precision: str) -> np.ndarray:
    """x as the mat-vec kernels of `precision` see it, float64 (T, cols): fp16 d times the
    8-bit codes ("fast"), or d2 times the 15-bit codes 254 q1 + q2 ("precise")."""
    if precision == "fast":
        codes, scales, _ = quantized_activations(x)
        blocks = codes.reshape(x.shape[0], -1, 32).astype(np.float64)  # (T, cols / 32, 32)
        return (blocks * scales.astype(np.float64)[..., None]).reshape(x.shape)  # (T, cols)
    pairs, d2, _ = precise_activations(x)
    q15 = _RADIX * pairs[..., 0, :].astype(np.float64) + pairs[..., 1, :]  # (T, cols / 32, 32)
    return (q15 * d2.astype(np.float64)[..., None]).reshape(x.shape)  # (T, cols)


def upload(dev, ggml_type: int, rows: int, cols: int, seed: int) -> tuple[DeviceMatrix, np.ndarray]:
    """A random matrix on the device, and its reference float32 values (rows, cols)."""
    raw = random_weights(ggml_type, rows, cols, np.random.default_rng(seed))
    matrix, note = upload_matrix(dev, WeightSpec("w", raw.reshape(-1), ggml_type, (rows, cols)))
    assert note is None and matrix.ggml_type == ggml_type and matrix.nbytes == raw.nbytes
    return matrix, reference_dequantize(raw.reshape(-1), ggml_type, rows, cols)


def run_linear(dev, products: Products, m: DeviceMatrix, x: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
    """products.linear on the device: (T, m.rows) float32."""
    x_ptr = dev.to_device(x)
    out = dev.alloc(4 * x.shape[0] * m.rows)
    bias_ptr = 0 if bias is None else dev.to_device(bias)
    products.linear(x_ptr, x.shape[0], m, out, bias_ptr)
    result = dev.from_device(out, (x.shape[0], m.rows), np.float32)
    for ptr in (x_ptr, out, bias_ptr):
        if ptr:
            dev.free(ptr)
    return result


def check_product(got: np.ndarray, w: np.ndarray, x: np.ndarray, ggml_type: int, precision: str) -> None:
    """Check out = x @ w.T within bounds worked out for the path the token count takes (and,
    for quantized weights and at most SMALL_BATCH tokens, the activations' `precision`)."""
    w64, x64 = w.astype(np.float64), x.astype(np.float64)
    if x.shape[0] > SMALL_BATCH or ggml_type in (T.F32, T.F16, T.BF16):
        # Float products: float32 sums of at most `cols` terms err by at most cols * 2^-24 of
        # the sum of |terms| (the kernels' sums are shorter: per lane, then a tree of 32).
        bound = x.shape[1] * 2.0**-24 * (np.abs(x64) @ np.abs(w64).T)
        np.testing.assert_array_less(np.abs(got - x64 @ w64.T), bound + 1e-30)
        return
    # Quantized activations. Tight: against the same quantized activations, only float32
    # rounding remains: integer dot products are exact, and each 32-weight term takes a few
    # roundings; an offset format's two parts (d*q and m) may each be a few times |w|, hence 1e-4.
    xa = dequantized_activations(x, precision)
    tight = 1e-4 * (np.abs(xa) @ np.abs(w64).T)
    np.testing.assert_array_less(np.abs(got - xa @ w64.T), tight + 1e-30)
    # Loose: against the float product, the activations' rounding per value, with
    # amax = max|x| over the value's 32-block.
    blocks = np.abs(x64).reshape(x.shape[0], -1, 32)  # (T, cols / 32, 32)
    amax = np.repeat(blocks.max(axis=-1), 32, axis=-1)  # (T, cols)
    if precision == "fast":
        # |x - d16 q| <= d / 2 + |d - d16| |q|, with d = amax / 127 and |d - d16| <= 2^-11 d.
        step = amax / 254 * (1 + 2.0**-10) + 2.0**-11 * np.abs(x64)
    else:
        # |x - d2 Q| <= d2 / 2 + d2 |x / d2 - fl(x / d2)|, with d2 = amax / 32258 (float32, to
        # 2^-24) and the division's rounding at most 2^-24 * 32258 < 2^-9: 15 bits.
        step = amax / _PRECISE_LEVELS * (0.5 + 2.0**-9) * (1 + 2.0**-23)
    np.testing.assert_array_less(np.abs(got - x64 @ w64.T), step @ np.abs(w64).T + tight + 1e-30)


@pytest.mark.parametrize("ggml_type", _TYPES, ids=lambda t: T(t).name)
@pytest.mark.parametrize("tokens", _TOKENS)
def test_linear_matches_reference(dev, fast_products, ggml_type, tokens):
    cols = _COLS.get(T(ggml_type), 1120)
    m, w = upload(dev, ggml_type, _ROWS, cols, seed=ggml_type)
    x = np.random.default_rng(tokens).normal(0, 1, (tokens, cols)).astype(np.float32)
    got = run_linear(dev, fast_products, m, x)
    dev.free(m.ptr)
    check_product(got, w, x, ggml_type, "fast")


@pytest.mark.parametrize("ggml_type", _QUANTIZED_TYPES, ids=lambda t: T(t).name)
@pytest.mark.parametrize("tokens", (1, 2, 5, 16))
def test_precise_products_are_within_15_bits(dev, products, fast_products, ggml_type, tokens):
    """The precise mode keeps its 15-bit bound, and errs far less than the fast mode on the same
    inputs: 1/168 to 1/390 of it, measured (1/254 is the ratio of the codes' steps)."""
    cols = _COLS.get(T(ggml_type), 1120)
    m, w = upload(dev, ggml_type, _ROWS, cols, seed=ggml_type)
    x = np.random.default_rng(tokens).normal(0, 1, (tokens, cols)).astype(np.float32)
    precise, fast = run_linear(dev, products, m, x), run_linear(dev, fast_products, m, x)
    dev.free(m.ptr)
    check_product(precise, w, x, ggml_type, "precise")
    exact = x.astype(np.float64) @ w.astype(np.float64).T  # (T, rows)
    assert np.abs(precise - exact).max() <= np.abs(fast - exact).max() / 50


def test_unknown_precision_is_refused(dev):
    with pytest.raises(ValueError, match="precise, fast"):
        Products(dev, precision="exact")


def run_quantize(dev, kernel: str, x: np.ndarray, codes_per_value: int, scale_bytes: int) -> tuple[np.ndarray, bytes]:
    """The quantizing kernel `kernel` on x (T, cols): its codes (T * cols * codes_per_value,)
    int8 and its scales' bytes."""
    n_blocks = x.size // 32
    x_ptr, codes, scales = dev.to_device(x), dev.alloc(codes_per_value * x.size), dev.alloc(scale_bytes * n_blocks)
    launch_blocks = -(-n_blocks // 32)  # 32 value blocks per 256 threads
    args = [np.uintp(x_ptr), np.uintp(codes), np.uintp(scales), np.int32(n_blocks)]
    dev.launch(dev.function("products", kernel), (launch_blocks, 1, 1), (256, 1, 1), args)
    got_codes = dev.from_device(codes, (codes_per_value * x.size,), np.int8)
    got_scales = dev.from_device(scales, (scale_bytes * n_blocks,), np.uint8).tobytes()
    for ptr in (x_ptr, codes, scales):
        dev.free(ptr)
    return got_codes, got_scales


def test_precise_activations_match_their_rule(dev):
    x = np.random.default_rng(6).normal(0, 1, (3, 1280)).astype(np.float32)
    x[1, 32:64] = 0.0  # an all-zero block: d2 = 0 and codes 0
    x[2, 64:96] *= 1e4
    # A block with d2 = 2^-10 exactly (max|x| = 32258 * 2^-10), its values Q * 2^-10 worked out
    # by hand: Q = 254 q1 + q2, q1 the nearest (halves down), q2 in -127..126; rint's ties even.
    hand = {32258: (127, 0), -32258: (-127, 0), 127: (1, -127), -127: (0, -127), 381: (2, -127), 0.5: (0, 0),
            1.5: (0, 2), -2.5: (0, -2), 12345.25: (49, -101), -200: (-1, 54)}  # fmt: skip
    x[0, 96 : 96 + len(hand)] = np.array(list(hand), dtype=np.float32) * 2.0**-10
    x[0, 96 + len(hand) : 128] = 0.0
    got_codes, got_scales = run_quantize(dev, "quantize_act_q8x2", x, 2, 8)
    pairs = got_codes.reshape(3, -1, 2, 32)  # (T, cols / 32, [q1, q2], 32)
    scales = np.frombuffer(got_scales, dtype=[("d2", "<f4"), ("sum", "<i4")]).reshape(3, -1)  # (T, cols / 32)
    want_codes, want_d2, want_sums = precise_activations(x)
    np.testing.assert_array_equal(pairs, want_codes)
    np.testing.assert_array_equal(scales["d2"], want_d2)
    np.testing.assert_array_equal(scales["sum"], want_sums)
    assert scales["d2"][0, 3] == 2.0**-10
    assert [tuple(pairs[0, 3, :, i]) for i in range(len(hand))] == list(hand.values())
    # The two-code rule in exact arithmetic: q1 = round(x / d1) with d1 = 254 d2 but where x / d1
    # is within 1/508 of a half, q2 = round((x - d1 q1) / d2), and |x - d1 q1 - d2 q2| <= d2 / 2.
    d2 = scales["d2"].astype(np.float64)[..., None]  # (T, cols / 32, 1)
    blocks = x.astype(np.float64).reshape(3, -1, 32)  # (T, cols / 32, 32)
    q1, q2 = pairs[..., 0, :].astype(np.float64), pairs[..., 1, :].astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        y = np.where(d2 > 0, blocks / (_RADIX * d2), 0.0)  # x / d1
        clear = np.abs(np.abs(y - np.floor(y)) - 0.5) > 1 / 500
        np.testing.assert_array_equal(q1[clear], np.rint(y)[clear])
        residual = np.where(d2 > 0, (blocks - _RADIX * d2 * q1) / d2, 0.0)
    assert np.abs(residual - q2).max() <= 0.5 + 2.0**-9


def test_quantized_activations_match_their_rule(dev):
    x = np.random.default_rng(5).normal(0, 1, (3, 256)).astype(np.float32)
    x[1, 32:64] = 0.0  # an all-zero block: d = 0 and codes 0
    got_codes, got_scales = run_quantize(dev, "quantize_act_q8", x, 1, 4)
    scales = np.frombuffer(got_scales, dtype=[("d", "<f2"), ("sum", "<i2")])  # (blocks,)
    want_codes, want_d, want_sums = quantized_activations(x)
    np.testing.assert_array_equal(got_codes.reshape(x.shape), want_codes)
    np.testing.assert_array_equal(scales["d"], want_d.reshape(-1))
    np.testing.assert_array_equal(scales["sum"], want_sums.reshape(-1))


@pytest.mark.parametrize("tokens", (1, 3, 40))
def test_bias_is_added(dev, products, tokens):
    m, _ = upload(dev, T.Q4_K, _ROWS, 512, seed=1)
    x = np.random.default_rng(2).normal(0, 1, (tokens, 512)).astype(np.float32)
    bias = np.random.default_rng(3).normal(0, 10, _ROWS).astype(np.float32)
    plain = run_linear(dev, products, m, x)
    biased = run_linear(dev, products, m, x, bias)
    dev.free(m.ptr)
    np.testing.assert_allclose(biased, plain + bias, rtol=1e-6, atol=1e-5)


@pytest.mark.parametrize("ggml_type", _TYPES, ids=lambda t: T(t).name)
def test_rows_are_the_dequantized_rows(dev, products, ggml_type):
    cols = _COLS.get(T(ggml_type), 1120)
    m, w = upload(dev, ggml_type, _ROWS, cols, seed=ggml_type + 100)
    ids = np.array([3, 69, 0, 3, 41], dtype=np.int32)
    scale = 25.298221  # sqrt(640), Gemma's embedding scale
    ids_ptr, out = dev.to_device(ids), dev.alloc(4 * len(ids) * cols)
    products.rows(m, ids_ptr, len(ids), out, 1.0)
    np.testing.assert_array_equal(dev.from_device(out, (len(ids), cols), np.float32), w[ids])
    products.rows(m, ids_ptr, len(ids), out, scale)
    np.testing.assert_array_equal(dev.from_device(out, (len(ids), cols), np.float32), w[ids] * np.float32(scale))
    for ptr in (ids_ptr, out, m.ptr):
        dev.free(ptr)


def test_join_matrices(dev, products):
    q, _ = upload(dev, T.Q4_K, 64, 512, seed=7)
    k, _ = upload(dev, T.Q4_K, 32, 512, seed=8)
    joined = join_matrices(dev, [q, k])
    assert joined is not None and (joined.rows, joined.cols, joined.nbytes) == (96, 512, q.nbytes + k.nbytes)
    x = np.random.default_rng(9).normal(0, 1, (2, 512)).astype(np.float32)
    np.testing.assert_array_equal(
        run_linear(dev, products, joined, x),
        np.concatenate([run_linear(dev, products, q, x), run_linear(dev, products, k, x)], axis=1),
    )
    other, _ = upload(dev, T.Q8_0, 32, 512, seed=10)
    narrower, _ = upload(dev, T.Q4_K, 32, 256, seed=11)
    assert join_matrices(dev, [q, other]) is None
    assert join_matrices(dev, [q, narrower]) is None
    for m in (q, k, joined, other, narrower):
        dev.free(m.ptr)


@pytest.mark.parametrize("ggml_type", [T.Q3_K, T.IQ4_NL], ids=lambda t: t.name)
def test_other_types_are_converted_to_f16_with_a_note(dev, products, ggml_type):
    raw = random_weights(ggml_type, 64, 512, np.random.default_rng(12))
    m, note = upload_matrix(dev, WeightSpec("blk.0.ffn_up.weight", raw.reshape(-1), ggml_type, (64, 512)))
    assert m.ggml_type == T.F16 and note is not None and ggml_type.name in note
    w = quants.dequantize(raw.reshape(-1), ggml_type).reshape(64, 512).astype(np.float16).astype(np.float32)
    x = np.random.default_rng(13).normal(0, 1, (3, 512)).astype(np.float32)
    got = run_linear(dev, products, m, x)
    dev.free(m.ptr)
    check_product(got, w, x, T.F16, "precise")


@pytest.mark.parametrize("order", ["reverse", "shuffled"])
@pytest.mark.parametrize("tokens", (1, 5, 40))
def test_same_results_in_every_thread_order(order, tokens):
    """A missing barrier or a lane reading another's unwritten value would change the results
    with the order the emulator runs threads in."""
    results = []
    for run_order in ("forward", order):
        device = emulator_device.EmulatorDevice(order=run_order)
        m, w = upload(device, T.Q5_K, _ROWS, 1280, seed=14)
        x = np.random.default_rng(15).normal(0, 1, (tokens, 1280)).astype(np.float32)
        results.append(run_linear(device, Products(device), m, x))
        device.close()
    np.testing.assert_array_equal(results[0], results[1])
    check_product(results[1], w, x, T.Q5_K, "precise")
