"""The number formats a KV cache may store its keys and values in, and their rounding.

- "f16": IEEE half precision, rounded to nearest even (the default: half of float32's bytes,
  and what llama.cpp keeps by default).
- "q8_0": GGUF's Q8_0 blocks: 32 values share a float16 scale d = max|x| / 127, and each is
  stored as round(x / d) in int8 (34 bytes for 32 values), rounded as llama.cpp's
  `quantize_row_q8_0_ref` rounds: the codes are round-half-away-from-zero of x * (1 / d) in
  float32, and d is rounded to float16 after the codes were made. A row's length must be a
  multiple of 32.
- "f32": float32, no rounding (kept for checks).

Every backend stores the same rounded values: this module is the reference the NumPy
backend stores through, and the cpu kernels (`cpu_kernels/ops.c`) round the same way.
"""

import numpy as np

KV_TYPES = ("f16", "q8_0", "f32")
DEFAULT_KV_TYPE = "f16"
Q8_0_BLOCK = 32
Q8_0_DTYPE = np.dtype([("d", "<f2"), ("qs", "i1", (Q8_0_BLOCK,))])
"""One Q8_0 block as GGUF lays it out: a float16 scale, then 32 int8 codes (34 bytes)."""


def check_kv_type(kv_type: str) -> str:
    """`kv_type` if it names a KV type; raises ValueError listing the types otherwise."""
    if kv_type not in KV_TYPES:
        raise ValueError(f"unknown KV type {kv_type!r}: choose one of {', '.join(KV_TYPES)}")
    return kv_type


def fits_kv_type(kv_type: str, dim: int) -> bool:
    """Whether rows of `dim` values can be stored as `kv_type` (Q8_0 needs whole blocks)."""
    return kv_type != "q8_0" or dim % Q8_0_BLOCK == 0


def kv_row_bytes(kv_type: str, dim: int) -> int:
    """Bytes one row of `dim` keys or values takes as `kv_type`."""
    if kv_type == "f32":
        return 4 * dim
    if kv_type == "f16":
        return 2 * dim
    if kv_type == "q8_0":
        if dim % Q8_0_BLOCK:
            raise ValueError(f"Q8_0 stores rows of whole blocks of {Q8_0_BLOCK}, not {dim} values")
        return dim // Q8_0_BLOCK * Q8_0_DTYPE.itemsize
    raise ValueError(check_kv_type(kv_type))


def kv_storage(kv_type: str, shape: tuple[int, ...]) -> np.ndarray:
    """Zeros for rows of `shape` (..., dim) stored as `kv_type`: float32 or float16 of that
    shape, or Q8_0 blocks (..., dim / 32) of `Q8_0_DTYPE`."""
    if kv_type == "q8_0":
        kv_row_bytes(kv_type, shape[-1])  # refuses a dim that is not whole blocks
        return np.zeros((*shape[:-1], shape[-1] // Q8_0_BLOCK), dtype=Q8_0_DTYPE)
    return np.zeros(shape, dtype=np.float16 if check_kv_type(kv_type) == "f16" else np.float32)


def encode_rows(kv_type: str, x: np.ndarray) -> np.ndarray:
    """float32 rows x (..., dim) in `kv_type`'s storage form (see `kv_storage`)."""
    x = np.asarray(x, dtype=np.float32)
    if kv_type == "f32":
        return x
    if kv_type == "f16":
        return x.astype(np.float16)  # round to nearest even, as IEEE conversion does
    blocks = x.reshape(*x.shape[:-1], x.shape[-1] // Q8_0_BLOCK, Q8_0_BLOCK)  # (..., dim / 32, 32)
    amax = np.abs(blocks).max(axis=-1, keepdims=True)  # (..., dim / 32, 1)
    d = amax / np.float32(127.0)
    with np.errstate(divide="ignore"):
        inverse = np.where(d > 0, np.float32(1.0) / d, np.float32(0.0)).astype(np.float32)
    scaled = blocks * inverse
    codes = np.trunc(scaled)  # roundf: half away from zero (np.round would round half to even)
    codes += np.where(np.abs(scaled - codes) >= np.float32(0.5), np.sign(scaled), np.float32(0.0))
    out = np.empty(blocks.shape[:-1], dtype=Q8_0_DTYPE)  # (..., dim / 32)
    out["d"] = d[..., 0].astype(np.float16)
    out["qs"] = codes.astype(np.int8)
    return out


def decode_rows(stored: np.ndarray) -> np.ndarray:
    """Rows in a KV storage form back to float32 (..., dim): exact, every stored value is a
    float32 (a Q8_0 value is its code times its block's float16 scale)."""
    if stored.dtype != Q8_0_DTYPE:
        return stored.astype(np.float32)
    values = stored["qs"].astype(np.float32) * stored["d"].astype(np.float32)[..., None]  # (..., dim / 32, 32)
    return values.reshape(*stored.shape[:-1], -1)  # (..., dim)
