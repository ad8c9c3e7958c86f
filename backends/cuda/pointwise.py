"""Launchers for `kernels/norms_rope.cu`: RMS and layer norms, rotary embedding and the
elementwise ops, over float32 row-major buffers given as device pointers."""

import numpy as np

from backends.cuda.device import Device

_THREADS = 256  # POINTWISE_THREADS and ROPE_THREADS in norms_rope.cu
_WARP_ROW_LIMIT = 256  # rows up to this long (per-head norms) get a warp each; longer ones a block each
_MAX_BLOCKS = 4096  # the elementwise kernels' grid-stride loops need no more
_MAX_ROPE_DIM = 512  # ROPE_MAX_HALF * 2
_UNARY_OPS = {"scale": 0, "softcap": 1, "silu": 2, "gelu_tanh": 3}
_GATED_KINDS = {"silu": 2, "gelu_tanh": 3, "sigmoid": 4, "swiglu_oai": 5}


class Pointwise:
    """The norms, rope and elementwise kernels of one device."""

    def __init__(self, dev: Device):
        self.dev = dev
        self._functions = {
            name: dev.function("norms_rope", name)
            for name in (
                "rms_norm_warp",
                "rms_norm_block",
                "layer_norm_warp",
                "layer_norm_block",
                "unary",
                "add",
                "gated",
                "rope",
            )
        }

    def _row_launch(self, name: str, rows: int, dim: int, args: list[np.generic]) -> None:
        """Launch a norm's warp-per-row or block-per-row kernel, as the row length suits."""
        if dim <= _WARP_ROW_LIMIT:
            grid = (-(-rows // (_THREADS // 32)), 1, 1)
            self.dev.launch(self._functions[f"{name}_warp"], grid, (_THREADS, 1, 1), args)
        else:
            self.dev.launch(self._functions[f"{name}_block"], (rows, 1, 1), (_THREADS, 1, 1), args)

    def _elementwise(self, name: str, n: int, args: list[np.generic]) -> None:
        if n > 0:
            grid = (min(-(-n // _THREADS), _MAX_BLOCKS), 1, 1)
            self.dev.launch(self._functions[name], grid, (_THREADS, 1, 1), args)

    def rms_norm(self, x: int, rows: int, dim: int, weight: int, eps: float, out: int) -> None:
        """out (rows, dim) = x / sqrt(mean(x**2) + eps) * weight, per row; weight (dim,). out may be x."""
        head: list[np.generic] = [np.uintp(x), np.int32(rows), np.int32(dim), np.uintp(weight)]
        self._row_launch("rms_norm", rows, dim, [*head, np.float32(eps), np.uintp(out)])

    def layer_norm(self, x: int, rows: int, dim: int, weight: int, bias: int, eps: float, out: int) -> None:
        """out (rows, dim) = (x - mean) / sqrt(var + eps) * weight + bias, per row; bias 0: none. out may be x."""
        head: list[np.generic] = [np.uintp(x), np.int32(rows), np.int32(dim), np.uintp(weight), np.uintp(bias)]
        self._row_launch("layer_norm", rows, dim, [*head, np.float32(eps), np.uintp(out)])

    def add(self, a: int, b: int, n: int, out: int) -> None:
        """out = a + b over n floats. out may be a or b."""
        self._elementwise("add", n, [np.uintp(a), np.uintp(b), np.int32(n), np.uintp(out)])

    def _unary(self, x: int, n: int, op: str, factor: float, out: int) -> None:
        self._elementwise(
            "unary", n, [np.uintp(x), np.int32(n), np.int32(_UNARY_OPS[op]), np.float32(factor), np.uintp(out)]
        )

    def scale(self, x: int, n: int, factor: float, out: int) -> None:
        """out = x * factor over n floats. out may be x."""
        self._unary(x, n, "scale", factor, out)

    def softcap(self, x: int, n: int, cap: float, out: int) -> None:
        """out = cap * tanh(x / cap) over n floats. out may be x."""
        self._unary(x, n, "softcap", cap, out)

    def activation(self, x: int, n: int, kind: str, out: int) -> None:
        """out = act(x) over n floats, kind "silu" or "gelu_tanh". out may be x."""
        if kind not in ("silu", "gelu_tanh"):
            raise ValueError(f"unknown activation {kind!r} (an ungated MLP takes silu or gelu_tanh)")
        self._unary(x, n, kind, 0.0, out)

    def gated(
        self, gate: int, up: int, rows: int, cols: int, kind: str, out: int, gate_cols: int | None = None
    ) -> None:
        """out (rows, cols) = act(gate) * up for kind silu, gelu_tanh, sigmoid or swiglu_oai
        (as `Backend.gated_activation` says); gate is (rows, cols), or (rows, 1) with
        gate_cols 1 (one sigmoid gate per row). out may be up, or gate when gate_cols is cols."""
        if kind not in _GATED_KINDS:
            raise ValueError(f"unknown activation {kind!r}")
        gate_cols = cols if gate_cols is None else gate_cols
        if gate_cols not in (1, cols):
            raise ValueError(f"a gate has one column or {cols}, not {gate_cols}")
        args: list[np.generic] = [np.uintp(gate), np.uintp(up), np.int32(rows), np.int32(cols), np.int32(gate_cols)]
        self._elementwise("gated", rows * cols, [*args, np.int32(_GATED_KINDS[kind]), np.uintp(out)])

    def rope(
        self,
        x: int,
        t: int,
        heads: int,
        head_dim: int,
        positions: int,
        base: float,
        rope_dim: int,
        neox: bool,
        freq_factors: int,
        mscale: float,
        out: int,
    ) -> None:
        """Rotate x (t, heads, head_dim) as `Backend.rope` says: positions a device int32 (t,),
        freq_factors a device float32 (rope_dim / 2,) or 0. out may be x."""
        if rope_dim % 2 or not 0 < rope_dim <= min(head_dim, _MAX_ROPE_DIM):
            raise ValueError(f"cannot rotate {rope_dim} of {head_dim} features (even, at most {_MAX_ROPE_DIM})")
        if t == 0:
            return
        base_hi = np.float32(base)
        base_lo = np.float32(base - float(base_hi))  # the kernel sums the two in double: the base to 48 bits
        args: list[np.generic] = [np.uintp(x), np.int32(heads), np.int32(head_dim), np.uintp(positions)]
        args += [base_hi, base_lo, np.int32(rope_dim), np.int32(neox), np.uintp(freq_factors), np.float32(mscale)]
        args.append(np.uintp(out))
        self.dev.launch(self._functions["rope"], (t, 1, 1), (_THREADS, 1, 1), args)
