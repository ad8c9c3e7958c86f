"""Dequantization of GGUF tensors to float32: the reference the other backends are tested against.

gguf-py (llama.cpp's own Python package) does the work for every block format it can
dequantize. This module adds what it leaves out:

- the plain element types F64, I8, I16, I32 and I64, which are a NumPy cast;
- Q1_0, the 1-bit format of PrismML's Bonsai models, which gguf-py names but cannot
  dequantize.

Q8_1 and Q8_K, which gguf-py also names but cannot dequantize, are llama.cpp's
intermediate formats for activations; model files do not hold them, and neither does Sprig.

Shapes are NumPy's, row-major: the last dimension is GGUF's ne0, the one blocks run along.
"""

import math

import numpy as np
from gguf import GGML_QUANT_SIZES, quants
from gguf import GGMLQuantizationType as T

from backends.errors import TensorDataError, UnsupportedTensorType

# Types that gguf.quants.dequantize handles (checked against gguf 0.19).
_GGUF_PY_TYPES = frozenset(
    {
        T.F32,
        T.F16,
        T.BF16,
        T.Q4_0,
        T.Q4_1,
        T.Q5_0,
        T.Q5_1,
        T.Q8_0,
        T.Q2_K,
        T.Q3_K,
        T.Q4_K,
        T.Q5_K,
        T.Q6_K,
        T.IQ1_S,
        T.IQ1_M,
        T.IQ2_XXS,
        T.IQ2_XS,
        T.IQ2_S,
        T.IQ3_XXS,
        T.IQ3_S,
        T.IQ4_NL,
        T.IQ4_XS,
        T.TQ1_0,
        T.TQ2_0,
        T.MXFP4,
        T.NVFP4,
    }
)

# Plain element types that gguf.quants.dequantize leaves out: their NumPy dtype.
_PLAIN_DTYPES = {
    T.F64: np.float64,
    T.I8: np.int8,
    T.I16: np.int16,
    T.I32: np.int32,
    T.I64: np.int64,
}

_SUPPORTED = _GGUF_PY_TYPES | set(_PLAIN_DTYPES) | {T.Q1_0}


def supported_types() -> list[int]:
    """The GGML type ids `dequantize` accepts, in ascending order."""
    return sorted(int(t) for t in _SUPPORTED)


def block_size(ggml_type: int) -> tuple[int, int]:
    """(weights per block, bytes per block) of a GGML type, from gguf-py's table.

    Defined for every type gguf-py names, including those `dequantize` rejects, so that a
    file reader can size every tensor. Raises UnsupportedTensorType for an unknown id.
    """
    return GGML_QUANT_SIZES[_known_type(ggml_type)]


def dequantize(data: np.ndarray, ggml_type: int, shape: tuple[int, ...]) -> np.ndarray:
    """Dequantize one whole tensor to float32.

    data: the tensor's bytes, a uint8 array such as a slice of a memmap (an array of any
    other dtype is read as its raw bytes). ggml_type: the GGML type id. shape: the
    tensor's NumPy shape, last dimension = GGUF ne0.

    Returns a float32 array of `shape`. For F32 tensors it is a view of `data`, not a
    copy, so treat the result as read-only. Raises UnsupportedTensorType for a type
    outside `supported_types()`, TensorDataError when the bytes do not fit the shape.
    """
    qtype = _supported_type(ggml_type)
    shape = tuple(int(n) for n in shape)
    raw = _tensor_bytes(data, qtype, shape)
    if qtype == T.Q1_0:
        values = _dequantize_q1_0(raw)
    elif qtype in _PLAIN_DTYPES:
        values = raw.view(_PLAIN_DTYPES[qtype]).astype(np.float32)
    else:
        row_bytes = _row_bytes(qtype, shape[-1])
        values = quants.dequantize(raw.reshape(-1, row_bytes), qtype)  # (n_rows, row_bytes) -> (n_rows, ne0)
    return values.reshape(shape)


def dequantize_rows(data: np.ndarray, ggml_type: int, shape: tuple[int, ...], rows: slice | np.ndarray) -> np.ndarray:
    """Dequantize only some rows of a 2-D tensor, reading only those rows' bytes.

    data, ggml_type, shape: as for `dequantize`, for the whole tensor; shape is
    (n_rows, n_cols). rows: a slice, or an integer array of row indices of any shape
    (token ids, for an embedding lookup). Returns float32 of shape (rows selected,
    n_cols) for a slice, rows.shape + (n_cols,) for an array. An index out of range
    raises NumPy's IndexError.
    """
    qtype = _supported_type(ggml_type)
    if len(shape) != 2:
        raise TensorDataError(f"dequantize_rows needs a 2-D tensor, but the shape is {tuple(shape)}")
    n_rows, n_cols = (int(n) for n in shape)
    raw = _tensor_bytes(data, qtype, (n_rows, n_cols))
    picked = raw.reshape(n_rows, -1)[rows]  # (n_rows, row_bytes) -> (*selection, row_bytes)
    return dequantize(picked, qtype, (*picked.shape[:-1], n_cols))


# Q1_0: 128 weights in 18 bytes, 1.125 bits per weight.
#
#   byte   0     1      2        3              17
#        +-----+-----+--------+--------+-----+---------+
#        |  d (fp16) | qs[0]  | qs[1]  | ... | qs[15]  |
#        +-----+-----+--------+--------+-----+---------+
#
#   qs[i], least significant bit first:
#        bit   7   6   5   4   3   2   1   0
#            +---+---+---+---+---+---+---+---+
#            |w7 |w6 |w5 |w4 |w3 |w2 |w1 |w0 |   weight 8*i + b is bit b of qs[i]
#            +---+---+---+---+---+---+---+---+
#
#   bit 1 -> +d,  bit 0 -> -d

# Row v holds the eight signs that byte v encodes, bit 0 first.
_Q1_0_SIGNS = (
    np.unpackbits(np.arange(256, dtype=np.uint8)[:, None], axis=-1, bitorder="little").astype(np.float32) * 2 - 1
)  # (256, 8)

# Blocks per pass: each pass's output (2 MiB) stays in cache between its two steps.
_Q1_0_CHUNK_BLOCKS = 4096


def _q1_0_blocks(blocks: np.ndarray, out: np.ndarray) -> None:
    """Dequantize Q1_0 blocks, (n_blocks, 18) uint8, into `out`, (n_blocks, 128) float32."""
    d = blocks[:, :2].view(np.float16).astype(np.float32)  # (n_blocks, 1)
    signs = out.reshape(len(blocks), 16, 8)  # (n_blocks, byte, bit)
    np.take(_Q1_0_SIGNS, blocks[:, 2:], axis=0, out=signs, mode="clip")  # uint8 indices are in range
    signs *= d[:, :, None]


def _dequantize_q1_0(raw: np.ndarray) -> np.ndarray:
    """Dequantize a whole Q1_0 tensor's bytes, a pass of _Q1_0_CHUNK_BLOCKS blocks at a time."""
    weights, size = GGML_QUANT_SIZES[T.Q1_0]
    blocks = raw.reshape(-1, size)  # (n_blocks, 18)
    out = np.empty((len(blocks), weights), dtype=np.float32)  # (n_blocks, 128)
    for start in range(0, len(blocks), _Q1_0_CHUNK_BLOCKS):
        stop = start + _Q1_0_CHUNK_BLOCKS
        _q1_0_blocks(blocks[start:stop], out[start:stop])
    return out


def _known_type(ggml_type: int) -> T:
    try:
        return T(int(ggml_type))
    except ValueError:
        raise UnsupportedTensorType(
            f"unknown GGML tensor type {int(ggml_type)}; the model may need a newer Sprig"
        ) from None


def _supported_type(ggml_type: int) -> T:
    qtype = _known_type(ggml_type)
    if qtype not in _SUPPORTED:
        raise UnsupportedTensorType(
            f"tensors of type {qtype.name} ({int(qtype)}) are not supported; "
            "use a model file quantized to another type, such as Q4_K or Q8_0"
        )
    return qtype


def _row_bytes(qtype: T, n_cols: int) -> int:
    weights, size = GGML_QUANT_SIZES[qtype]
    if n_cols % weights:
        raise TensorDataError(
            f"a {qtype.name} tensor's rows must hold a multiple of {weights} values, but its rows hold {n_cols}"
        )
    return n_cols // weights * size


def _tensor_bytes(data: np.ndarray, qtype: T, shape: tuple[int, ...]) -> np.ndarray:
    """`data` as a flat uint8 array, checked to hold exactly the bytes of `shape`."""
    if not shape:
        raise TensorDataError(f"a {qtype.name} tensor needs at least one dimension")
    expected = math.prod(shape[:-1]) * _row_bytes(qtype, shape[-1])
    raw = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
    if raw.size != expected:
        raise TensorDataError(
            f"a {qtype.name} tensor of shape {shape} takes {expected} bytes, "
            f"but {raw.size} were given; the file may be truncated or corrupt"
        )
    return raw
