"""GGUF blocks repacked, exactly, into MLX's affine quantized format.

MLX's affine format splits each row into groups of `group_size` consecutive weights and
stores every weight as an unsigned `bits`-bit integer q, with one scale and one bias per
group:

    w = scale * q + bias

The q of a row are packed little-endian into uint32 words: weight i of the row occupies
bits [i * bits, (i + 1) * bits) of the row's bit stream. That is the layout
`mx.quantize` returns and `mx.quantized_matmul` / `mx.dequantize` read.

Several GGUF block formats are already of that form, with a group of 32 (a block, or a
K-quant's sub-block) or 128 weights. They are repacked here block by block, never through
a float copy of the matrix:

    type   group bits  q                           scale        bias
    Q4_0    32    4    4-bit code                  d            -8 d
    Q4_1    32    4    4-bit code                  d            m
    Q5_0    32    5    4-bit code | high bit << 4  d            -16 d
    Q5_1    32    5    4-bit code | high bit << 4  d            m
    Q8_0    32    8    int8 code + 128             d            -128 d
    Q4_K    32    4    4-bit code                  d * sc_j     -dmin * m_j    (sub-block j)
    Q5_K    32    5    4-bit code | high bit << 4  d * sc_j     -dmin * m_j
    Q1_0   128    1    sign bit (1 -> +d, 0 -> -d)  2 d          -d

Scales and biases are kept as float32: every one of them is exact there (an fp16 value
times a power of two, or an fp16 value times a 6-bit integer, 17 significant bits at most),
so `scale * q + bias` rounds exactly as gguf-py's dequantization does. In float16 the
K-quants' products d * sc_j would be rounded.

MLX releases without 1-bit kernels get Q1_0 as 2-bit codes with the same scale and bias.
Other block formats (Q6_K's and Q2_K/Q3_K's 16-weight sub-blocks, the IQ and ternary types)
have no exact affine form in MLX's group sizes (32, 64, 128).
"""

from dataclasses import dataclass

import numpy as np
from gguf import GGML_QUANT_SIZES, quants
from gguf import GGMLQuantizationType as T

from backends.errors import TensorDataError

# (group size, bits) of each convertible type; Q1_0 may fall back to 2 bits.
AFFINE_LAYOUTS: dict[int, tuple[int, int]] = {
    T.Q4_0: (32, 4),
    T.Q4_1: (32, 4),
    T.Q5_0: (32, 5),
    T.Q5_1: (32, 5),
    T.Q8_0: (32, 8),
    T.Q4_K: (32, 4),
    T.Q5_K: (32, 5),
    T.Q1_0: (128, 1),
}
_CHUNK_WEIGHTS = 1 << 22  # weights repacked per pass: bounds the temporary arrays to tens of MB


@dataclass(frozen=True)
class AffineMatrix:
    """A matrix in MLX's affine format, as NumPy arrays ready for `mx.array`.

    packed (rows, cols * bits / 32) uint32; scales and biases (rows, cols / group_size)
    float32.
    """

    packed: np.ndarray
    scales: np.ndarray
    biases: np.ndarray
    group_size: int
    bits: int


def affine_layout(ggml_type: int, one_bit: bool = True) -> tuple[int, int] | None:
    """(group size, bits) that a GGML type converts to exactly, or None if it has no such form.

    `one_bit=False` asks for Q1_0 as 2-bit codes, for MLX builds without 1-bit kernels.
    """
    layout = AFFINE_LAYOUTS.get(int(ggml_type))
    if layout == (128, 1) and not one_bit:
        return 128, 2
    return layout


def to_affine(raw: np.ndarray, ggml_type: int, shape: tuple[int, ...], one_bit: bool = True) -> AffineMatrix:
    """Repack a 2-D tensor's GGUF blocks (uint8, as in the file) into MLX's affine format.

    Works a slice of rows at a time. Raises TensorDataError when the bytes do not match the
    shape, ValueError for a type without an affine layout (see `affine_layout`).
    """
    qtype = T(int(ggml_type))
    layout = affine_layout(qtype, one_bit)
    if layout is None:
        raise ValueError(f"{qtype.name} blocks have no exact form in MLX's affine format")
    group_size, bits = layout
    block_weights, block_bytes = GGML_QUANT_SIZES[qtype]
    n_rows, n_cols = shape
    if n_cols % block_weights or raw.size != n_rows * n_cols // block_weights * block_bytes:
        raise TensorDataError(
            f"a {qtype.name} tensor of shape {tuple(shape)} cannot take {raw.size} bytes; "
            "the file may be truncated or corrupt"
        )
    rows = raw.reshape(n_rows, -1)  # (n_rows, row_bytes)
    packed = np.empty((n_rows, n_cols * bits // 32), dtype=np.uint32)
    scales = np.empty((n_rows, n_cols // group_size), dtype=np.float32)
    biases = np.empty_like(scales)
    step = max(1, _CHUNK_WEIGHTS // n_cols)
    for lo in range(0, n_rows, step):
        chunk = rows[lo : lo + step]
        n = len(chunk)
        q, scale, bias = _BLOCK_DECODERS[qtype](chunk.reshape(-1, block_bytes))  # blocks: (n_blocks, block_bytes)
        packed[lo : lo + n] = pack_rows(q.reshape(n, n_cols), bits)
        scales[lo : lo + n] = scale.reshape(n, -1)  # (n, n_cols / group_size)
        biases[lo : lo + n] = bias.reshape(n, -1)
    return AffineMatrix(packed, scales, biases, group_size, bits)


def pack_rows(q: np.ndarray, bits: int) -> np.ndarray:
    """Pack codes q (rows, cols) uint8, each below 2**bits, into MLX's uint32 words.

    Eight codes fill exactly `bits` bytes, so each run of eight is assembled in a uint64
    and its low `bits` bytes are kept: (rows, cols * bits / 32) uint32. cols must be a
    multiple of 32 (every GGUF block is).
    """
    n_rows, n_cols = q.shape
    runs = q.reshape(n_rows, n_cols // 8, 8).astype(np.uint64)  # (rows, runs, 8)
    word = np.zeros(runs.shape[:2], dtype=np.uint64)  # (rows, runs)
    for k in range(8):
        word |= runs[..., k] << np.uint64(bits * k)
    run_bytes = word.astype("<u8").view(np.uint8).reshape(n_rows, -1, 8)[..., :bits]  # (rows, runs, bits)
    return np.ascontiguousarray(run_bytes).reshape(n_rows, -1).view("<u4")  # (rows, cols * bits / 32)


# -- block decoders: blocks (n, bytes) uint8 -> q (n, weights) uint8, scale and bias (n, groups) --


def _f16(blocks: np.ndarray, at: int) -> np.ndarray:
    """The fp16 field at byte `at` of every block, as float32: (n, 1)."""
    return np.ascontiguousarray(blocks[:, at : at + 2]).view(np.float16).astype(np.float32)


def _nibbles(qs: np.ndarray, run: int) -> np.ndarray:
    """4-bit codes of runs of `run` bytes, each run's low nibbles first, then its high ones.

    The 4-bit GGUF formats store weight j of a run's 2 * run weights in the low nibble of
    byte j and weight run + j in its high nibble (run = 16 for Q4_0 to Q5_1, 32 for the
    64-weight chunks of Q4_K and Q5_K). (n, bytes) -> (n, 2 * bytes).
    """
    runs = qs.reshape(len(qs), -1, 1, run)  # (n, runs, 1, run)
    return np.concatenate([runs & 0x0F, runs >> 4], axis=2).reshape(len(qs), -1)  # (n, runs * 2 * run)


def _high_bits(qh: np.ndarray) -> np.ndarray:
    """Fifth bits of Q5_0/Q5_1: bit j of the little-endian 32-bit qh is weight j's: (n, 32)."""
    return np.unpackbits(qh, axis=-1, bitorder="little")


# Q4_0 (18 bytes):  | d: fp16 | qs[16]: weight j in the low nibble of qs[j], j+16 in the high |
def _q4_0(blocks):
    d = _f16(blocks, 0)
    return _nibbles(blocks[:, 2:18], 16), d, -8 * d


# Q4_1 (20 bytes):  | d: fp16 | m: fp16 | qs[16] as Q4_0 |
def _q4_1(blocks):
    return _nibbles(blocks[:, 4:20], 16), _f16(blocks, 0), _f16(blocks, 2)


# Q5_0 (22 bytes):  | d: fp16 | qh: 32 high bits, LSB = weight 0 | qs[16] as Q4_0 |
def _q5_0(blocks):
    d = _f16(blocks, 0)
    return _nibbles(blocks[:, 6:22], 16) | _high_bits(blocks[:, 2:6]) << 4, d, -16 * d


# Q5_1 (24 bytes):  | d: fp16 | m: fp16 | qh[4] | qs[16] |
def _q5_1(blocks):
    return _nibbles(blocks[:, 8:24], 16) | _high_bits(blocks[:, 4:8]) << 4, _f16(blocks, 0), _f16(blocks, 2)


# Q8_0 (34 bytes):  | d: fp16 | qs: 32 int8 |   int8 c + 128 is c with its sign bit flipped
def _q8_0(blocks):
    d = _f16(blocks, 0)
    return blocks[:, 2:34] ^ np.uint8(0x80), d, -128 * d


# Q4_K (144 bytes, 256 weights in 8 sub-blocks of 32):
#   | d: fp16 | dmin: fp16 | scales[12]: eight 6-bit sc_j and m_j | qs[128] |
#   qs[32c + l]: low nibble -> weight 64c + l (sub-block 2c), high -> 64c + 32 + l (2c + 1)
def _k_scales(blocks):
    sc, m = quants.Q4_K.get_scale_min(blocks[:, 4:16])  # (n, 8) each
    return _f16(blocks, 0) * sc.astype(np.float32), -_f16(blocks, 2) * m.astype(np.float32)


def _q4_k(blocks):
    return (_nibbles(blocks[:, 16:144], 32), *_k_scales(blocks))


# Q5_K (176 bytes): | d | dmin | scales[12] | qh[32] | qs[128] as Q4_K |
#   bit j of qh[l] is the fifth bit of weight 32j + l
def _q5_k(blocks):
    qh = blocks[:, 16:48]  # (n, 32)
    high = (qh[:, None, :] >> np.arange(8, dtype=np.uint8)[None, :, None]) & 1  # (n, 8 sub-blocks, 32)
    return (_nibbles(blocks[:, 48:176], 32) | high.reshape(len(blocks), 256) << 4, *_k_scales(blocks))


# Q1_0 (18 bytes):  | d: fp16 | 16 bytes of bits, LSB first: weight 8i + b is bit b of byte i |
def _q1_0(blocks):
    d = _f16(blocks, 0)
    return np.unpackbits(blocks[:, 2:18], axis=-1, bitorder="little"), 2 * d, -d


_BLOCK_DECODERS = {
    T.Q4_0: _q4_0,
    T.Q4_1: _q4_1,
    T.Q5_0: _q5_0,
    T.Q5_1: _q5_1,
    T.Q8_0: _q8_0,
    T.Q4_K: _q4_k,
    T.Q5_K: _q5_k,
    T.Q1_0: _q1_0,
}


# MXFP4 (gpt-oss's experts), 32 weights in 17 bytes:
#
#   byte   0        1        2             16
#        +-----+--------+--------+-----+---------+
#        |  e  | qs[0]  | qs[1]  | ... | qs[15]  |      scale 2^(e - 128), values kvalues[code]
#        +-----+--------+--------+-----+---------+
#
#   weight j < 16 is the low nibble of qs[j], weight j + 16 its high nibble: FP4 E2M1 codes,
#   whose values, doubled, are ggml's kvalues {0, 1, 2, 3, 4, 6, 8, 12, and their negatives}.
#   MLX's "mxfp4" mode has the same codes and scale byte (its values undoubled, its scale
#   2^(e - 127)), with the codes in order, eight to a uint32, the lowest nibble first.


def mxfp4_codes(raw: np.ndarray, shape: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """MXFP4 blocks of a (rows, cols) matrix as MLX's mxfp4 arrays: codes (rows, cols / 8)
    uint32 and scale exponents (rows, cols / 32) uint8; exact."""
    n_rows, n_cols = shape
    blocks = np.asarray(raw, dtype=np.uint8).reshape(n_rows, n_cols // 32, 17)  # (rows, groups, bytes)
    qs = blocks[..., 1:]  # (rows, groups, 16)
    codes = np.concatenate([qs & 15, qs >> 4], axis=-1)  # (rows, groups, 32): weight order
    pairs = (codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8)  # (rows, groups, 16)
    packed = np.ascontiguousarray(pairs).reshape(n_rows, n_cols // 2).view("<u4")  # (rows, cols / 8)
    return packed.astype(np.uint32), np.ascontiguousarray(blocks[..., 0])
