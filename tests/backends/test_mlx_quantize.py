"""GGUF blocks repacked into MLX's affine format, against gguf-py's own dequantization.

For every type with an exact affine form, random blocks are repacked by
`backends.mlx_quantize` and `mx.dequantize` of the result must equal the reference bit for
bit. Tolerance: none. Both sides compute in float32 from the same fp16 fields; every
product involved (d * sc * q: at most 11 + 6 + 5 significant bits) is exact there, so the
one rounding left, of the final sum, rounds the same exact value on both sides.

Blocks come from gguf-py's quantizer where it has one (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0);
for the K-quants and Q1_0 they are random bytes with random finite fp16 scales, which
reach every code and every 6-bit sub-block scale and min. The reference is
`gguf.quants.dequantize`, and `backends.dequant` for Q1_0 (gguf-py cannot dequantize it;
backends.dequant's Q1_0 is tested against hand-decoded blocks in test_dequant.py).
"""

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, quants
from gguf import GGMLQuantizationType as T

from backends import mlx_quantize
from backends.dequant import dequantize
from backends.errors import TensorDataError
from backends.mlx_quantize import affine_layout, to_affine

mx = pytest.importorskip("mlx.core", reason="mlx is not installed (pip install 'sprig[mlx]')")

GGUF_PY_QUANTIZES = [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0]
RANDOM_BYTES = [T.Q4_K, T.Q5_K, T.Q1_0]
SHAPE = (6, 512)  # two K-quant super-blocks, four Q1_0 blocks, sixteen 32-weight blocks per row


# Byte offsets of the fp16 fields (scales, mins) in the blocks of the types gguf-py cannot quantize.
FP16_FIELDS = {T.Q4_K: (0, 2), T.Q5_K: (0, 2), T.Q1_0: (0,), T.Q6_K: (-2,), T.Q3_K: (-2,), T.Q2_K: (-4, -2)}


def random_blocks(qtype: T, shape: tuple[int, int], rng: np.random.Generator, scale: float = 1.0) -> np.ndarray:
    """GGUF bytes of a random (rows, cols) tensor of `qtype`, flat uint8.

    gguf-py quantizes random normal weights where it can; otherwise the blocks are random
    bytes whose fp16 fields (FP16_FIELDS) are random normals times `scale`, so that every
    value is finite.
    """
    if qtype in GGUF_PY_QUANTIZES:
        return quants.quantize(scale * rng.standard_normal(shape).astype(np.float32), qtype).reshape(-1)
    weights, size = GGML_QUANT_SIZES[qtype]
    blocks = rng.integers(0, 256, size=(shape[0] * shape[1] // weights, size), dtype=np.uint8)  # (n_blocks, size)
    for at in FP16_FIELDS[qtype]:
        field = (scale * rng.standard_normal(len(blocks))).astype(np.float16)
        blocks[:, at % size:at % size + 2] = field.view(np.uint8).reshape(-1, 2)
    return blocks.reshape(-1)


def dequantize_affine(m: mlx_quantize.AffineMatrix) -> np.ndarray:
    """MLX's own dequantization of a repacked matrix, float32."""
    return np.array(mx.dequantize(mx.array(m.packed), mx.array(m.scales), mx.array(m.biases),
                                  group_size=m.group_size, bits=m.bits))


@pytest.mark.parametrize("qtype", GGUF_PY_QUANTIZES + RANDOM_BYTES, ids=lambda t: t.name)
def test_mlx_dequantizes_the_repacked_blocks_exactly(qtype):
    raw = random_blocks(qtype, SHAPE, np.random.default_rng(int(qtype)))
    converted = to_affine(raw, qtype, SHAPE)
    np.testing.assert_array_equal(dequantize_affine(converted), dequantize(raw, qtype, SHAPE))


def test_q1_0_as_two_bit_codes_where_mlx_has_no_one_bit_kernels():
    raw = random_blocks(T.Q1_0, SHAPE, np.random.default_rng(7))
    converted = to_affine(raw, T.Q1_0, SHAPE, one_bit=False)
    assert (converted.group_size, converted.bits) == (128, 2)
    np.testing.assert_array_equal(dequantize_affine(converted), dequantize(raw, T.Q1_0, SHAPE))


@pytest.mark.parametrize("qtype,group,bits", [
    (T.Q4_0, 32, 4), (T.Q4_1, 32, 4), (T.Q5_0, 32, 5), (T.Q5_1, 32, 5), (T.Q8_0, 32, 8),
    (T.Q4_K, 32, 4), (T.Q5_K, 32, 5), (T.Q1_0, 128, 1),
], ids=lambda v: getattr(v, "name", str(v)))
def test_layout_and_packed_size(qtype, group, bits):
    converted = to_affine(random_blocks(qtype, SHAPE, np.random.default_rng(1)), qtype, SHAPE)
    assert (converted.group_size, converted.bits) == (group, bits)
    assert converted.packed.dtype == np.uint32 and converted.packed.shape == (SHAPE[0], SHAPE[1] * bits // 32)
    assert converted.scales.dtype == np.float32 and converted.scales.shape == (SHAPE[0], SHAPE[1] // group)


@pytest.mark.parametrize("qtype", [T.F32, T.F16, T.BF16, T.Q6_K, T.Q2_K, T.Q3_K, T.IQ4_NL, T.TQ2_0],
                         ids=lambda t: t.name)
def test_types_without_an_exact_affine_form(qtype):
    assert affine_layout(qtype) is None
    with pytest.raises(ValueError, match="no exact form"):
        to_affine(np.zeros(0, dtype=np.uint8), qtype, (0, 256))


def test_rows_are_repacked_a_slice_at_a_time(monkeypatch):
    """Tensors larger than one pass are cut into row slices; the slices must join seamlessly."""
    monkeypatch.setattr(mlx_quantize, "_CHUNK_WEIGHTS", 2 * SHAPE[1] + 1)  # two rows per pass, the last pass one row
    shape = (7, SHAPE[1])
    raw = random_blocks(T.Q4_K, shape, np.random.default_rng(3))
    np.testing.assert_array_equal(dequantize_affine(to_affine(raw, T.Q4_K, shape)), dequantize(raw, T.Q4_K, shape))


def test_truncated_bytes_are_a_tensor_data_error():
    raw = random_blocks(T.Q8_0, SHAPE, np.random.default_rng(4))
    with pytest.raises(TensorDataError, match="truncated or corrupt"):
        to_affine(raw[:-34], T.Q8_0, SHAPE)
