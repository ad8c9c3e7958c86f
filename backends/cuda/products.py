"""Launchers for `kernels/products.cu`: matrix products with the weights kept in their GGUF
blocks on the device, and rows of such matrices (embedding lookups).

A matrix is (rows, cols) = (out_features, in_features), its rows contiguous runs of blocks.
Products go three ways, by the number of tokens T:
- T = 1..16, quantized weights: the activations are quantized per 32 values into a scratch
  buffer, as two 8-bit codes per value (15 bits, precision "precise", the default) or one
  (precision "fast", llama.cpp's scheme), then one kernel reads each weight block once for all
  T tokens (dp4a);
- T = 1..16, float weights (F32, F16, BF16): the same shape of kernel, float products;
- T > 16: a tiled GEMM that dequantizes weight tiles into shared memory.
Types outside `IN_PLACE_TYPES` are converted to F16 when they are uploaded.
"""

from dataclasses import dataclass

import numpy as np
from gguf import GGMLQuantizationType as T

from backends.base import WeightSpec
from backends.cuda.device import Device
from backends.dequant import dequantize
from backends.errors import UnsupportedTensorType

_KERNEL_SUFFIX = {
    T.Q4_0: "q4_0",
    T.Q4_1: "q4_1",
    T.Q5_0: "q5_0",
    T.Q5_1: "q5_1",
    T.Q8_0: "q8_0",
    T.Q1_0: "q1_0",
    T.Q4_K: "q4_k",
    T.Q5_K: "q5_k",
    T.Q6_K: "q6_k",
    T.F32: "f32",
    T.F16: "f16",
    T.BF16: "bf16",
}
_FLOAT_TYPES = frozenset({int(T.F32), int(T.F16), int(T.BF16)})

IN_PLACE_TYPES: frozenset[int] = frozenset(int(t) for t in _KERNEL_SUFFIX)
"""GGML types whose blocks the kernels read as they lie in the file."""

SMALL_BATCH = 16
"""The most tokens the mat-vec kernels take at once; more go to the GEMM."""

_ACCUMULATORS = (1, 4, SMALL_BATCH)  # the mat-vec kernels' token counts (NT in products.cu)
_MV_WARPS = 4  # MV_WARPS: each warp owns 2 rows (quantized weights, one token: MvRowsQ) or 1
_MV_THREADS = 128
_GEMM_TILE = 64  # GEMM_TILE: rows and tokens per block
_GEMM_THREADS = 256
_QUANTIZE_BLOCKS_PER_LAUNCH_BLOCK = 32  # 8 threads per 32-value block, 256 threads
_QUANTIZE_THREADS = 256
_ROWS_THREADS = 128
_SUB_BLOCK = 32  # weights per sub-block, the kernels' unit along a row
_ALIGN = 256


@dataclass(frozen=True)
class DeviceMatrix:
    """A (rows, cols) weight matrix on the device: `nbytes` bytes of `ggml_type` blocks at `ptr`."""

    ptr: int
    ggml_type: int
    rows: int
    cols: int
    nbytes: int


@dataclass(frozen=True)
class _Precision:
    """How the mat-vec kernels quantize activations: `codes` 8-bit codes per value, and
    `scale_bytes` per 32 values (ActCodes<NC> in products.cu)."""

    codes: int
    scale_bytes: int
    quantize: str  # the quantizing kernel
    mat_vec: str  # the family of the product kernels


PRECISIONS = {
    "precise": _Precision(codes=2, scale_bytes=8, quantize="quantize_act_q8x2", mat_vec="mvq2"),
    "fast": _Precision(codes=1, scale_bytes=4, quantize="quantize_act_q8", mat_vec="mvq"),
}
"""The activation precisions of the quantized mat-vec products: "precise", two 8-bit codes per
value (x ~ d1 q1 + d2 q2, 15 bits); "fast", one (8 bits, as llama.cpp's MMVQ)."""


def _ptr(p: int) -> np.uintp:
    return np.uintp(p)


def upload_matrix(dev: Device, spec: WeightSpec) -> tuple[DeviceMatrix, str | None]:
    """Put the 2-D weight `spec` (rows, cols) on the device.

    Types in IN_PLACE_TYPES go up as their blocks lie in the file. Any other type that
    `backends.dequant` can read is converted to F16, and the second value is then a note for
    the user that names the type; otherwise it is None. Raises UnsupportedTensorType for a
    type that cannot be read, or a row the kernels cannot take (not whole 32-weight groups).
    """
    if len(spec.shape) != 2:
        raise ValueError(f"{spec.name}: a matrix needs two dimensions, not the shape {spec.shape}")
    rows, cols = (int(n) for n in spec.shape)
    if cols % _SUB_BLOCK:
        raise UnsupportedTensorType(
            f"{spec.name}: rows of {cols} weights are not whole groups of {_SUB_BLOCK}, which the CUDA kernels need"
        )
    ggml_type = int(spec.ggml_type)
    note = None
    if ggml_type in IN_PLACE_TYPES:
        data = np.ascontiguousarray(spec.raw).view(np.uint8)
    else:
        values = dequantize(spec.raw, ggml_type, (rows, cols))  # (rows, cols) float32
        data = values.astype(np.float16).view(np.uint8)
        note = (
            f"CUDA: {T(ggml_type).name} weights are not multiplied in place; they were converted to "
            "float16 when the model loaded, which takes more memory and time per token."
        )
        ggml_type = int(T.F16)
    return DeviceMatrix(dev.to_device(data), ggml_type, rows, cols, int(data.nbytes)), note


def join_matrices(dev: Device, parts: list[DeviceMatrix]) -> DeviceMatrix | None:
    """One new matrix holding the rows of `parts` one after another (q, k, v or gate, up), or
    None when they differ in type or width. The parts stay allocated; the caller frees them."""
    if not parts or any(p.ggml_type != parts[0].ggml_type or p.cols != parts[0].cols for p in parts):
        return None
    nbytes = sum(p.nbytes for p in parts)
    ptr = dev.alloc(nbytes)
    offset = 0
    for p in parts:
        dev.copy(ptr + offset, p.ptr, p.nbytes)
        offset += p.nbytes
    return DeviceMatrix(ptr, parts[0].ggml_type, sum(p.rows for p in parts), parts[0].cols, nbytes)


def _accumulators(t: int) -> int:
    return next(n for n in _ACCUMULATORS if t <= n)


def _blocks(n: int, per: int) -> int:
    return -(-n // per)


class Products:
    """The product and row kernels of one device, and the scratch buffer of quantized activations.

    `precision` (a key of PRECISIONS) sets how the mat-vec kernels quantize activations:
    "precise" (the default) or "fast"."""

    def __init__(self, dev: Device, precision: str = "precise"):
        if precision not in PRECISIONS:
            raise ValueError(f"unknown precision {precision!r}: choose one of {', '.join(PRECISIONS)}")
        self.dev = dev
        self.precision = precision
        self._scheme = PRECISIONS[precision]
        self._quantize = dev.function("products", self._scheme.quantize)
        quantized_family = self._scheme.mat_vec
        self._mat_vec = {
            (int(t), n): dev.function(
                "products", f"{'mvf' if int(t) in _FLOAT_TYPES else quantized_family}_{suffix}_{n}"
            )
            for t, suffix in _KERNEL_SUFFIX.items()
            for n in _ACCUMULATORS
        }
        self._gemm = {int(t): dev.function("products", f"gemm_{suffix}") for t, suffix in _KERNEL_SUFFIX.items()}
        self._rows = {int(t): dev.function("products", f"rows_{suffix}") for t, suffix in _KERNEL_SUFFIX.items()}
        self._scratch = 0
        self._scratch_bytes = 0

    def close(self) -> None:
        """Free the scratch buffer."""
        if self._scratch:
            self.dev.free(self._scratch)
            self._scratch, self._scratch_bytes = 0, 0

    def _quantized_activations(self, x: int, t: int, cols: int) -> tuple[int, int]:
        """Quantize x (t, cols) into the scratch buffer: (codes pointer, scales pointer)."""
        n_blocks = t * cols // _SUB_BLOCK
        codes_bytes = _blocks(self._scheme.codes * t * cols, _ALIGN) * _ALIGN
        need = codes_bytes + self._scheme.scale_bytes * n_blocks
        if need > self._scratch_bytes:
            self.close()
            self._scratch_bytes = max(need, 2 * self._scratch_bytes)
            self._scratch = self.dev.alloc(self._scratch_bytes)
        codes, scales = self._scratch, self._scratch + codes_bytes
        grid = (_blocks(n_blocks, _QUANTIZE_BLOCKS_PER_LAUNCH_BLOCK), 1, 1)
        args: list[np.generic] = [_ptr(x), _ptr(codes), _ptr(scales), np.int32(n_blocks)]
        self.dev.launch(self._quantize, grid, (_QUANTIZE_THREADS, 1, 1), args)
        return codes, scales

    def linear(self, x: int, t: int, m: DeviceMatrix, out: int, bias: int = 0) -> None:
        """out (t, m.rows) float32 = x (t, m.cols) float32 @ W.T, plus bias (m.rows,) float32
        where `bias` is not 0. Mat-vec kernels up to SMALL_BATCH tokens, the GEMM beyond."""
        shape: list[np.generic] = [np.int32(m.rows), np.int32(m.cols), np.int32(t)]
        if t > SMALL_BATCH:
            grid = (_blocks(m.rows, _GEMM_TILE), _blocks(t, _GEMM_TILE), 1)
            args: list[np.generic] = [_ptr(m.ptr), _ptr(x), _ptr(bias), _ptr(out), *shape]
            self.dev.launch(self._gemm[m.ggml_type], grid, (_GEMM_THREADS, 1, 1), args)
            return
        if m.ggml_type in _FLOAT_TYPES:
            args = [_ptr(m.ptr), _ptr(x), _ptr(bias), _ptr(out), *shape]
        else:
            codes, scales = self._quantized_activations(x, t, m.cols)
            args = [_ptr(m.ptr), _ptr(codes), _ptr(scales), _ptr(bias), _ptr(out), *shape]
        n = _accumulators(t)
        rows_per_warp = 2 if n == 1 and m.ggml_type not in _FLOAT_TYPES else 1
        grid = (_blocks(m.rows, _MV_WARPS * rows_per_warp), 1, 1)
        self.dev.launch(self._mat_vec[m.ggml_type, n], grid, (_MV_THREADS, 1, 1), args)

    def rows(self, m: DeviceMatrix, ids: int, t: int, out: int, scale: float = 1.0) -> None:
        """out (t, m.cols) float32 = the rows `ids` (t,) int32 of m, dequantized, times `scale`."""
        grid = (_blocks(m.cols // _SUB_BLOCK, _ROWS_THREADS), t, 1)
        args: list[np.generic] = [_ptr(m.ptr), _ptr(ids), _ptr(out), np.int32(m.cols), np.float32(scale)]
        self.dev.launch(self._rows[m.ggml_type], grid, (_ROWS_THREADS, 1, 1), args)
