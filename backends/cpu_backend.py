"""The native CPU backend: C kernels that multiply GGUF blocks as the file stores them.

Weights are never copied to float: each matrix stays a view of the memory-mapped model
file, and the kernels (`backends/cpu_kernels/`) unpack each block as they go; Q1_0 blocks
are regrouped once at load, byte for byte, into tiles of 32 rows for the table-lookup
product, and so are the ternary TQ1_0 and TQ2_0 (as 2-bit codes, 66 bytes per 256 weights),
and the types on int16 codes (Q4_0 to Q8_0, IQ4_NL, MXFP4; Q4_K, Q6_K) into tiles of 8 rows, a
row per vector lane (cpu_kernels/row_tiles.c).
Activations are float32 NumPy arrays; before a matrix product each row is quantized in
groups of 32 (once, shared by q/k/v and by gate/up): to int16 codes, or for Q1_0 to 12-bit
codes and their lookup tables (ternary: 11-bit codes, a table per pair). The kernels read the llama.cpp block formats
in place (legacy, K-quants, ternary TQ, IQ: the table in cpu_kernels/kernels.h); types
without a kernel are converted once at load to Q8_0 and the load notes say so.

A mixture-of-experts layer's stacks (E, out, in) stay views of the file too (`CpuExperts`):
`route` picks each token's experts in C and `experts` reads that choice in the same pass, so
only the chosen experts' rows are read, and a recorded pass makes the choice anew each call.

Every op is a tuple (see module.c) that runs at once, unless a pass is being recorded:
the backend's runner (`backends/cpu_runner.py`) records short passes (decoding, a
speculative draft's verification, a batched step) once per model and layout of state
(`CpuState`), and replays them in C, one call per pass.
"""

import mmap
from collections.abc import Sequence
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType, quants

from backends import cpu_native
from backends.base import (
    AttentionState,
    Backend,
    DeltaNetLayer,
    ExpertWeights,
    Forward,
    LayerAttention,
    LayerState,
    RecurrentState,
    Routing,
    WeightSpec,
)
from backends.cpu_runner import Recorder, RecordingRunner, Slot, StepInput, aligned_zeros, lines
from backends.delta_rule import row_groups
from backends.dequant import block_size, dequantize
from backends.errors import TensorDataError
from backends.kv_types import kv_storage

_ACTIVATIONS = {"silu": 0, "gelu_tanh": 1, "swiglu_oai": 2}
_ROUTING_ORDERS = {"softmax_top_k": 0, "top_k_softmax": 1}
_Q8_0 = GGMLQuantizationType.Q8_0
# the types multiplied from tiles of 32 rows by table lookup (cpu_kernels/q1_tiles.c, tq_tiles.c)
_TILED_TYPES = frozenset({GGMLQuantizationType.Q1_0, GGMLQuantizationType.TQ1_0, GGMLQuantizationType.TQ2_0})
# the types multiplied from tiles of 8 rows with a row per vector lane (cpu_kernels/row_tiles.c:
# row_tiled_type): on int16 activation codes the 32-weight ones, Q4_K and Q6_K; on 8-bit ones Q2_K
_ROW_TILED_TYPES = frozenset(
    {
        GGMLQuantizationType.Q4_0,
        GGMLQuantizationType.Q4_1,
        GGMLQuantizationType.Q5_0,
        GGMLQuantizationType.Q5_1,
        GGMLQuantizationType.Q8_0,
        GGMLQuantizationType.IQ4_NL,
        GGMLQuantizationType.MXFP4,
        GGMLQuantizationType.Q4_K,
        GGMLQuantizationType.Q6_K,
        GGMLQuantizationType.Q2_K,
    }
)
_KV_CODES = {"f32": 0, "f16": 1, "q8_0": 2}  # the KV types' codes in the kernels (ops.h: KV_F32, ...)


def _bufs(a=None, b=None, c=None, out=None, ids=None, pos=None, table=None, kcache=None, vcache=None, d=None) -> tuple:
    return (a, b, c, out, ids, pos, table, kcache, vcache, d)


def op_tuple(ops: dict[str, tuple], name: str, bufs: tuple, mats: tuple, slots: dict[str, float]) -> tuple:
    """The kernels' tuple of the op `name` (module.c): its code and its int and float slots in
    the order `ops` (the module's OPS: name -> (code, int names, float names)) gives them.
    Raises ValueError naming what is missing or unknown."""
    if name not in ops:
        raise ValueError(f"the kernels have no op {name!r} (they have {', '.join(ops)})")
    code, int_names, float_names = ops[name]
    missing = [n for n in (*int_names, *float_names) if n not in slots]
    unknown = [n for n in slots if n not in int_names and n not in float_names]
    if missing or unknown:
        raise ValueError(
            f"op {name} takes ints ({', '.join(int_names)}) and floats ({', '.join(float_names)}): "
            f"missing {missing}, unknown {unknown}"
        )
    return code, bufs, mats, tuple(int(slots[n]) for n in int_names), tuple(float(slots[n]) for n in float_names)


def _file_backed(raw: np.ndarray) -> bool:
    """Whether `raw` views a memory-mapped file (whose pages can be dropped and read again)."""
    base: Any = raw
    while isinstance(base, np.ndarray):
        base = base.base
    if isinstance(base, memoryview):  # np.frombuffer's
        base = base.obj
    return isinstance(base, mmap.mmap)


def _pages_on_write(size: int) -> np.ndarray:
    """`size` bytes of anonymous memory that the process takes a small page at a time, as they
    are first written (no huge pages: a stack's experts are tiled one by one, scattered)."""
    flags = getattr(mmap, "MAP_PRIVATE", 0) | getattr(mmap, "MAP_ANONYMOUS", 0)
    pages = mmap.mmap(-1, size, flags=flags) if flags else mmap.mmap(-1, size)
    if hasattr(mmap, "MADV_NOHUGEPAGE"):
        pages.madvise(mmap.MADV_NOHUGEPAGE)
    return np.frombuffer(pages, dtype=np.uint8)


class CpuMatrix:
    """A weight matrix as GGUF blocks: `raw` holds `rows` rows of `cols` weights of `ggml_type`.

    A Q1_0, TQ1_0 or TQ2_0 matrix also keeps its blocks regrouped into tiles of 32 rows
    (`tiles`, made by the kernels when the backend first needs them), which the matrix
    product reads by table lookup; embedding lookups read `raw`. A matrix of a type on int16
    codes (the 32-weight ones, Q4_K, Q6_K) keeps them in tiles of 8 rows, which embedding
    lookups read too.
    """

    def __init__(self, name: str, raw: np.ndarray, ggml_type: int, rows: int, cols: int):
        self.name, self.raw, self.ggml_type, self.rows, self.cols = name, raw, ggml_type, rows, cols
        self.tiles: bytes | None = None

    def lookup_entry(self, row_tiles: int) -> tuple:
        """This matrix in an embedding op's tuple: its row tiles where it has them (a tied output
        head of a type on int16 codes; the kernels' type `row_tiles` + its own), whose file pages
        the kernel may have reclaimed, else its blocks."""
        if self.tiles is not None and self.ggml_type in _ROW_TILED_TYPES:
            return (self.tiles, row_tiles + self.ggml_type, self.rows, self.cols, None, None)
        return (self.raw, self.ggml_type, self.rows, self.cols, None, None)


class CpuExperts:
    """A stack of expert matrices (E, out, in) as GGUF blocks: `matrix` holds all E * out rows
    (a view of the file, never copied), expert e's rows e * out .. (e + 1) * out - 1. The
    experts op reads only the experts its tokens chose; nothing reads the others' pages,
    not even at load (their scales are not scanned: a damaged block shows as nan where it
    is used).

    A stack of a type on int16 codes (cpu_kernels/row_tiles.c) whose experts are whole tiles of
    8 rows is multiplied from row tiles, made expert by expert as the op first chooses each
    (`tiles`, of the blocks' size, its pages taken as they are written; `ready`, a flag per
    expert); each expert's blocks then leave the process, as a dense matrix's do."""

    def __init__(self, matrix: CpuMatrix, n_experts: int, rows_per_expert: int, tiled: bool = False):
        self.matrix, self.n_experts, self.rows_per_expert = matrix, n_experts, rows_per_expert
        self.tiles = _pages_on_write(matrix.raw.size) if tiled else None
        self.ready = np.zeros(n_experts, dtype=np.uint8) if tiled else None
        self.file_backed = _file_backed(matrix.raw)  # how the kernels let an expert's blocks go

    def entry(self, bias: Any, row_tiles: int) -> tuple:
        """This stack in an experts op's tuple, with its biases (E, out) or None: its tiles,
        the kernels' type `row_tiles` + its own, with the blocks to make them from, where it
        has them."""
        m = self.matrix
        flat = None if bias is None else np.ascontiguousarray(bias, dtype=np.float32).reshape(-1)
        if self.tiles is None:
            return (m.raw, m.ggml_type, m.rows, m.cols, None, flat)
        tiled = row_tiles + m.ggml_type
        return (self.tiles, tiled, m.rows, m.cols, None, flat, m.raw, self.ready, self.file_backed)


class CpuState:
    """One sequence's per-layer state in one float32 arena, 64-byte aligned.

    Attention layer i has keys (Hkv, rows, Dh) and values (Hkv, rows, Dv) in `keys[i]` and
    `values[i]`, views of the arena stored as the layer's KV type (`backends.kv_types`:
    float32, float16, or Q8_0 blocks whose last axis counts blocks of 32): rows = slots
    for a full layer (position p at row p), 2 * slots for a windowed ring, which is mirrored
    (position p at rows p % slots and p % slots + slots; attention.c draws it). The kernels
    take each as the float32 stretch of the arena it lies in (`kernel_keys[i]`,
    `kernel_values[i]`). A recurrent layer's arrays are `arrays[i]`, float32 zeros to start
    with. Each block starts on a cache line. `shape` (the layers' layouts) keys the recorded
    passes: states alike in it share them.
    """

    def __init__(self, layers: "list[LayerState]"):
        self.layers = tuple(layers)
        blocks = [[kv_storage(kv_type, shape) for kv_type, shape in _layer_arrays(layer)] for layer in self.layers]
        floats = [[-(-b.nbytes // 4) for b in layer] for layer in blocks]  # each array's bytes in whole floats
        self.arena = aligned_zeros(sum(lines(n) for layer in floats for n in layer))
        self.keys: list[np.ndarray | None] = []
        self.values: list[np.ndarray | None] = []
        self.kernel_keys: list[np.ndarray | None] = []
        self.kernel_values: list[np.ndarray | None] = []
        self.arrays: list[tuple[np.ndarray, ...]] = []
        at = 0
        for layer, arrays, counts in zip(self.layers, blocks, floats, strict=True):
            stretches, views = [], []
            for array, n in zip(arrays, counts, strict=True):
                stretch = self.arena[at : at + n]
                stretches.append(stretch)
                views.append(stretch.view(np.uint8)[: array.nbytes].view(array.dtype).reshape(array.shape))
                at += lines(n)
            attention = isinstance(layer, AttentionState)
            self.keys.append(views[0] if attention else None)
            self.values.append(views[1] if attention else None)
            self.kernel_keys.append(stretches[0] if attention else None)
            self.kernel_values.append(stretches[1] if attention else None)
            self.arrays.append(() if attention else tuple(views))

    @property
    def shape(self) -> tuple[LayerState, ...]:
        """The layers' layouts: states alike in them share recorded passes."""
        return self.layers


def _layer_arrays(layer: LayerState) -> list[tuple[str, tuple[int, ...]]]:
    """The arrays one layer keeps, each as (KV type, shape of its values): (keys, values), a
    ring's mirrored, or a recurrent layer's (float32)."""
    if isinstance(layer, RecurrentState):
        return [("f32", shape) for shape in layer.shapes]
    rows = 2 * layer.slots if layer.ring else layer.slots
    return [
        (layer.kv_type, (layer.kv_heads, rows, layer.head_dim)),
        (layer.kv_type, (layer.kv_heads, rows, layer.value_dim)),
    ]


class CpuBackend(Backend):
    """Runs every op in Sprig's C kernels, on quantized weights, with a thread pool."""

    name = "cpu"
    # A recorded batch pass over two sequences costs about 0.8 of their two compiled steps,
    # over four about 0.54 (docs/benchmarks.md): batching pays from two.
    min_decode_batch = 2

    def __init__(self, threads: int | None = None, tier: str | None = None):
        self.native = cpu_native.load(tier)
        self.threads = self.native.set_threads(threads or cpu_native.default_threads())
        self._load_notes: list[str] = []
        self._recorder: Recorder | None = None
        self._rope_tables: dict[tuple, np.ndarray] = {}
        self._sink_arrays: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self._gate_arrays: dict[int, tuple[DeltaNetLayer, np.ndarray]] = {}

    @property
    def device_name(self) -> str:
        return f"CPU ({self.threads} threads, {self.native.TIER} kernels)"

    @property
    def native_types(self) -> frozenset[int]:
        """The GGML types the kernels read in place (the table in cpu_kernels/kernels.h);
        `prepare_weight` converts the others."""
        return frozenset(self.native.NATIVE_TYPES)

    @property
    def load_notes(self) -> list[str]:
        return list(self._load_notes)

    # -- weights ---------------------------------------------------------------------

    def prepare_weight(self, spec: WeightSpec) -> np.ndarray | CpuMatrix | CpuExperts:
        if len(spec.shape) == 1 or spec.name.endswith(".bias"):  # norms and biases (experts' (E, F)): float32
            return dequantize(spec.raw, spec.ggml_type, spec.shape)
        if len(spec.shape) == 3:
            return self._experts(spec)
        if len(spec.shape) != 2:
            raise TensorDataError(f"{spec.name} has {len(spec.shape)} dimensions; a weight matrix has 2")
        rows, cols = spec.shape
        raw, ggml_type = spec.raw, int(spec.ggml_type)
        per_block, block_bytes = block_size(ggml_type)
        if ggml_type not in self.native_types or cols % per_block:
            raw, ggml_type = self._convert(spec)
            per_block, block_bytes = block_size(ggml_type)
        raw = raw.reshape(-1)
        n_blocks = rows * cols // per_block
        if raw.size != n_blocks * block_bytes:
            raise TensorDataError(
                f"{spec.name}: {raw.size} bytes of data for a {rows} x {cols} "
                f"{GGMLQuantizationType(ggml_type).name} matrix, which needs {n_blocks * block_bytes}"
            )
        bad = self.native.count_bad_scales(raw, ggml_type, n_blocks)
        if bad:
            raise TensorDataError(
                f"{spec.name} has {bad} blocks whose scale is infinite or not a number: the model file is damaged"
            )
        matrix = CpuMatrix(spec.name, raw, ggml_type, rows, cols)
        if ggml_type in _TILED_TYPES | _ROW_TILED_TYPES and not spec.name.endswith("token_embd.weight"):
            self._tiles(matrix)  # now, not at the first token (the embedding only if the output uses it)
        return matrix

    def prepare_output(self, weight: Any) -> None:
        """A tied output head (the token embedding) gets its tiles at load too."""
        if isinstance(weight, CpuMatrix) and weight.ggml_type in _TILED_TYPES | _ROW_TILED_TYPES:
            self._tiles(weight)

    def _experts(self, spec: WeightSpec) -> CpuExperts:
        """A stack of experts (E, out, in) read in place where the kernels multiply its type
        (Q1_0's tiles aside), else converted expert by expert as a matrix is."""
        n_experts, rows, cols = spec.shape
        raw, ggml_type = spec.raw.reshape(-1), int(spec.ggml_type)
        per_block, block_bytes = block_size(ggml_type)
        if ggml_type not in self.native_types or ggml_type == GGMLQuantizationType.Q1_0 or cols % per_block:
            per_expert = raw.size // n_experts
            parts = [
                self._convert(
                    WeightSpec(spec.name, raw[e * per_expert : (e + 1) * per_expert], ggml_type, (rows, cols)),
                    note=e == 0,
                )
                for e in range(n_experts)
            ]
            raw, ggml_type = np.concatenate([part for part, _ in parts]), parts[0][1]
            per_block, block_bytes = block_size(ggml_type)
        needed = n_experts * rows * cols // per_block * block_bytes
        if raw.size != needed:
            raise TensorDataError(
                f"{spec.name}: {raw.size} bytes of data for {n_experts} experts of {rows} x {cols} "
                f"{GGMLQuantizationType(ggml_type).name}, which need {needed}"
            )
        tiled = ggml_type in _ROW_TILED_TYPES and rows % self.native.ROW_TILE == 0
        return CpuExperts(CpuMatrix(spec.name, raw, ggml_type, n_experts * rows, cols), n_experts, rows, tiled)

    def _convert(self, spec: WeightSpec, note: bool = True) -> tuple[np.ndarray, int]:
        """Blocks of a type without a kernel, as Q8_0 (float32 if rows do not split into 32s)."""
        dense = dequantize(spec.raw, spec.ggml_type, spec.shape)
        source = GGMLQuantizationType(spec.ggml_type).name
        if spec.shape[1] % 32:
            target, raw = GGMLQuantizationType.F32, dense.view(np.uint8)
        else:
            target, raw = _Q8_0, quants.quantize(dense, _Q8_0)
        if note:
            self._load_notes.append(
                f"{spec.name} is {source}, which the cpu backend has no kernel for: converted to {target.name} at load"
            )
        return np.ascontiguousarray(raw).reshape(-1), int(target)

    def fuse_linear(self, weights: list[CpuMatrix]) -> tuple[CpuMatrix, ...]:
        """The matrices stay apart; one op multiplies them all after quantizing the input once."""
        return tuple(weights)

    def _product_entry(self, matrix: CpuMatrix, out: Any, bias: Any = None) -> tuple:
        """`matrix` in a matrix-product op's tuple, writing `out` and adding `bias`."""
        if matrix.ggml_type in _ROW_TILED_TYPES:
            tiled_type = self.native.ROW_TILES + matrix.ggml_type
        elif matrix.ggml_type == GGMLQuantizationType.Q1_0:
            tiled_type = self.native.Q1_0_TILES
        elif matrix.ggml_type in _TILED_TYPES:
            tiled_type = self.native.TQ_TILES
        else:
            return (matrix.raw, matrix.ggml_type, matrix.rows, matrix.cols, out, bias)
        return (self._tiles(matrix), tiled_type, matrix.rows, matrix.cols, out, bias)

    def _tiles(self, matrix: CpuMatrix) -> bytes:
        """A Q1_0, ternary or int16-codes matrix's blocks regrouped for its product, made once;
        the blocks then leave the process's memory (a mapped file's stay in the page cache)."""
        if matrix.tiles is None:
            shape, file_backed = (matrix.rows, matrix.cols), _file_backed(matrix.raw)
            matrix.tiles = self.native.tile(matrix.raw, matrix.ggml_type, *shape, file_backed)
        return matrix.tiles

    # -- running ops ------------------------------------------------------------------

    def _new(self, shape: tuple[int, ...]) -> Any:
        return self._recorder.new(shape) if self._recorder else np.empty(shape, dtype=np.float32)

    def _emit(self, name: str, bufs: tuple, mats: tuple = (), **slots: float) -> None:
        """Run (or record) the op `name` of the kernels' OPS table on `bufs` and `mats`, its int
        and float slots given by name; every slot the table names must be given, and no other."""
        op = op_tuple(self.native.OPS, name, bufs, mats, slots)
        if self._recorder:
            self._recorder.ops.append(op)
        else:
            self.native.run(op)

    # -- ops ----------------------------------------------------------------------------

    def embedding(self, weight: CpuMatrix, token_ids: Any, scale: float = 1.0) -> Any:
        ids = token_ids.view if isinstance(token_ids, StepInput) else np.ascontiguousarray(token_ids, dtype=np.int64)
        out = self._new((len(ids), weight.cols))
        entry = weight.lookup_entry(self.native.ROW_TILES)
        self._emit("embed", _bufs(out=out, ids=ids), (entry,), tokens=len(ids), scale=scale)
        return out

    def linear(self, x: Any, weight: CpuMatrix, bias: Any = None) -> Any:
        return self.linear_fused(x, (weight,), (bias,))[0]

    def linear_fused(self, x: Any, fused: tuple[CpuMatrix, ...], biases: tuple[Any, ...]) -> list[Any]:
        x = _contiguous(x)
        outs = [self._new((len(x), w.rows)) for w in fused]
        mats = tuple(self._product_entry(w, out, bias) for w, out, bias in zip(fused, outs, biases, strict=True))
        self._emit("linear", _bufs(a=x), mats, tokens=len(x))
        return outs

    def rms_norm(self, x: Any, weight: np.ndarray, eps: float) -> Any:
        x = _contiguous(x)
        out = self._new(x.shape)
        dim = x.shape[-1]
        self._emit("rms_norm", _bufs(a=x, b=weight, out=out), rows=int(np.prod(x.shape)) // dim, dim=dim, eps=eps)
        return out

    def layer_norm(self, x: Any, weight: np.ndarray, bias: np.ndarray | None, eps: float) -> Any:
        x = _contiguous(x)
        out = self._new(x.shape)
        dim = x.shape[-1]
        rows = int(np.prod(x.shape)) // dim
        self._emit("layer_norm", _bufs(a=x, b=weight, c=bias, out=out), rows=rows, dim=dim, eps=eps)
        return out

    def rope(
        self,
        x: Any,
        positions: Any,
        base: float,
        rope_dim: int,
        neox: bool,
        freq_factors: np.ndarray | None = None,
        mscale: float = 1.0,
    ) -> Any:
        if isinstance(positions, StepInput):
            pos, per_row = positions.view, positions.per_row
        else:  # consecutive positions from the first, or one per row (a batch of sequences)
            positions = np.asarray(positions, dtype=np.int64)
            per_row = bool(np.any(np.diff(positions) != 1))
            pos = np.ascontiguousarray(positions if per_row else positions[:1])
        x = _contiguous(x)
        out = self._new(x.shape)
        n_tokens, heads, dim = x.shape
        table = self._rope_table(base, rope_dim, freq_factors)
        self._emit(
            "rope",
            _bufs(a=x, out=out, pos=pos, table=table),
            tokens=n_tokens,
            heads=heads,
            dim=dim,
            rope_dim=rope_dim,
            neox=neox,
            per_row=per_row,
            mscale=mscale,
        )
        return out

    def _rope_table(self, base: float, rope_dim: int, freq_factors: np.ndarray | None) -> np.ndarray:
        """Inverse frequencies (rope_dim / 2,) float64, one array per distinct setting."""
        key = (base, rope_dim, None if freq_factors is None else np.asarray(freq_factors).tobytes())
        table = self._rope_tables.get(key)
        if table is None:
            table = base ** (-np.arange(rope_dim // 2, dtype=np.float64) * 2.0 / rope_dim)
            if freq_factors is not None:
                table = table / np.asarray(freq_factors, dtype=np.float64)
            table = self._rope_tables[key] = np.ascontiguousarray(table)
        return table

    def attention(
        self, q: Any, k: Any, v: Any, cache: CpuState, layer: int, start: Any, settings: LayerAttention
    ) -> Any:
        q, k, v = _contiguous(q), _contiguous(k), _contiguous(v)
        out = self._new((q.shape[0], q.shape[1] * v.shape[2]))  # (T, H * Dv)
        self._attend(q, k, v, out, cache, layer, start, settings)
        return out

    def attention_batch(
        self, q: Any, k: Any, v: Any, caches: list[CpuState], layer: int, starts: list[Any], settings: LayerAttention
    ) -> Any:
        q, k, v = _contiguous(q), _contiguous(k), _contiguous(v)
        out = self._new((q.shape[0], q.shape[1] * v.shape[2]))  # (B, H * Dv)
        for b, (cache, start) in enumerate(zip(caches, starts, strict=True)):
            self._attend(_row(q, b), _row(k, b), _row(v, b), _row(out, b), cache, layer, start, settings)
        return out

    def _attend(
        self, q: Any, k: Any, v: Any, out: Any, cache: CpuState, layer: int, start: Any, settings: LayerAttention
    ) -> None:
        """One attention op: q (T, H, Dh), k, v of one sequence at `start` on layer `layer` of
        `cache`, into `out` (T, H * Dv)."""
        n_tokens, heads, head_dim = q.shape
        kv_heads, value_dim = k.shape[1], v.shape[2]
        state = cache.layers[layer]
        if not isinstance(state, AttentionState):
            raise ValueError(f"layer {layer} keeps a recurrent state, not keys and values")
        pos = start if isinstance(start, np.ndarray) else np.array([start], dtype=np.int64)
        sinks = None if settings.sinks is None else self._sinks(settings.sinks, heads)
        self._emit(
            "attention",
            _bufs(
                a=q,
                b=k,
                c=v,
                out=out,
                pos=pos,
                kcache=cache.kernel_keys[layer],
                vcache=cache.kernel_values[layer],
                d=sinks,
            ),
            tokens=n_tokens,
            heads=heads,
            kv_heads=kv_heads,
            head_dim=head_dim,
            value_dim=value_dim,
            slots=state.slots,
            window=settings.window or 0,
            ring=state.ring,
            kv_type=_KV_CODES[state.kv_type],
            causal=settings.causal,
            scale=settings.scale,
            softcap=settings.softcap or 0.0,
        )

    def _sinks(self, sinks: np.ndarray, heads: int) -> np.ndarray:
        """A layer's sink logits (H,) as the float32 array the attention op reads, made once
        per layer (a recorded pass keeps it)."""
        key = id(sinks)
        held = self._sink_arrays.get(key)
        if held is None or held[0] is not sinks:
            flat = np.ascontiguousarray(sinks, dtype=np.float32).reshape(-1)
            if flat.size != heads:
                raise ValueError(f"{flat.size} attention sinks for {heads} query heads")
            held = self._sink_arrays[key] = (sinks, flat)
        return held[1]

    def gated_activation(self, gate: Any, up: Any, kind: str) -> Any:
        if kind == "sigmoid":
            out = self._new(up.shape)
            rows = up.shape[0]
            self._emit(
                "sigmoid_gate",
                _bufs(a=_contiguous(gate), b=_contiguous(up), out=out),
                rows=rows,
                dim=int(np.prod(up.shape)) // rows,
                gate_dim=int(np.prod(gate.shape)) // rows,
            )
            return out
        if kind not in _ACTIVATIONS:
            raise ValueError(f"unknown activation {kind!r}")
        out = self._new(gate.shape)
        self._emit(
            "gated",
            _bufs(a=_contiguous(gate), b=_contiguous(up), out=out),
            elements=int(np.prod(gate.shape)),
            activation=_ACTIVATIONS[kind],
        )
        return out

    def activation(self, x: Any, kind: str) -> Any:
        if kind not in ("silu", "gelu_tanh"):
            raise ValueError(f"{kind!r} is not an activation of one input")
        out = self._new(x.shape)
        self._emit(
            "gated", _bufs(a=_contiguous(x), out=out), elements=int(np.prod(x.shape)), activation=_ACTIVATIONS[kind]
        )
        return out

    def scale(self, x: Any, factor: float) -> Any:
        out = self._new(x.shape)
        self._emit("scale", _bufs(a=_contiguous(x), out=out), elements=int(np.prod(x.shape)), factor=factor)
        return out

    def route(self, logits: Any, routing: Routing) -> Any:
        if routing.order not in _ROUTING_ORDERS:
            raise ValueError(f"unknown routing order {routing.order!r}")
        logits = _contiguous(logits)
        n_tokens = len(logits)
        out = self._new((n_tokens, 2 * routing.n_used))  # (T, 2k): experts, then weights
        self._emit(
            "route",
            _bufs(a=logits, b=routing.expert_scale, out=out),
            tokens=n_tokens,
            experts=routing.n_experts,
            used=routing.n_used,
            order=_ROUTING_ORDERS[routing.order],
            normalize=routing.normalize,
        )
        return out

    def experts(self, x: Any, choice: Any, weights: ExpertWeights, activation: str) -> Any:
        if activation not in _ACTIVATIONS:
            raise ValueError(f"unknown activation {activation!r}")
        gate, up, down = weights.gate, weights.up, weights.down
        x, choice = _contiguous(x), _contiguous(choice)
        n_tokens = len(x)
        out = self._new((n_tokens, down.rows_per_expert))  # (T, D)
        tiles = self.native.ROW_TILES
        biases = (weights.gate_bias, weights.up_bias, weights.down_bias)
        mats = tuple(stack.entry(bias, tiles) for stack, bias in zip((gate, up, down), biases, strict=True))
        self._emit(
            "experts",
            _bufs(a=x, b=choice, out=out),
            mats,
            tokens=n_tokens,
            experts=gate.n_experts,
            used=choice.shape[1] // 2,
            ffn=gate.rows_per_expert,
            activation=_ACTIVATIONS[activation],
        )
        return out

    def columns(self, x: Any, start: int, count: int) -> Any:
        x = _contiguous(x)
        rows, cols = x.shape
        out = self._new((rows, count))
        self._emit("columns", _bufs(a=x, out=out), rows=rows, cols=cols, start=start, count=count)
        return out

    def short_conv(self, x: Any, weight: np.ndarray, states: Sequence[CpuState], layer: int) -> Any:
        x = _contiguous(x)
        out = self._new(x.shape)  # (T, C)
        channels, kernel = weight.shape
        for rows, state in zip(row_groups(len(x), len(states)), states, strict=True):
            window = state.arrays[layer][0]  # (K - 1, C)
            self._emit(
                "short_conv",
                _bufs(a=_rows(x, rows), b=weight, out=_rows(out, rows), kcache=window, vcache=window),
                tokens=rows.stop - rows.start,
                channels=channels,
                kernel=kernel,
            )
        return out

    def delta_net(
        self, x: Any, alpha: Any, beta: Any, settings: DeltaNetLayer, states: Sequence[CpuState], layer: int
    ) -> Any:
        x, alpha, beta = _contiguous(x), _contiguous(alpha), _contiguous(beta)
        out = self._new((len(x), settings.v_heads * settings.head_dim))  # (T, Hv * Dh)
        gates = self._gates(settings)
        for rows, state in zip(row_groups(len(x), len(states)), states, strict=True):
            memory = state.arrays[layer][1]  # (Hv, Dh, Dh)
            self._emit(
                "delta_net",
                _bufs(
                    a=_rows(x, rows),
                    b=_rows(alpha, rows),
                    c=_rows(beta, rows),
                    d=gates,
                    out=_rows(out, rows),
                    kcache=memory,
                    vcache=memory,
                ),
                tokens=rows.stop - rows.start,
                k_heads=settings.k_heads,
                v_heads=settings.v_heads,
                head_dim=settings.head_dim,
                chunk=settings.chunk,
                eps=settings.eps,
            )
        return out

    def _gates(self, settings: DeltaNetLayer) -> np.ndarray:
        """A DeltaNet layer's A and dt_bias as the one float32 array (2 Hv,) its op reads, made
        once per layer (a recorded pass keeps it)."""
        held = self._gate_arrays.get(id(settings))
        if held is None or held[0] is not settings:
            joined = np.concatenate([settings.a, settings.dt_bias]).astype(np.float32)
            held = self._gate_arrays[id(settings)] = (settings, joined)
        return held[1]

    def add(self, a: Any, b: Any) -> Any:
        out = self._new(a.shape)
        self._emit("add", _bufs(a=_contiguous(a), b=_contiguous(b), out=out), elements=int(np.prod(a.shape)))
        return out

    def softcap(self, x: Any, cap: float) -> Any:
        out = self._new(x.shape)
        self._emit("softcap", _bufs(a=_contiguous(x), out=out), elements=int(np.prod(x.shape)), cap=cap)
        return out

    def to_host(self, x: np.ndarray) -> np.ndarray:
        return np.asarray(x, dtype=np.float32)

    # -- per-layer state and the compiled passes --------------------------------------------

    def allocate_state(self, layers: list[LayerState]) -> CpuState:
        return CpuState(layers)

    def state_bytes(self, state: CpuState) -> int:
        return state.arena.nbytes

    def state_arrays(self, state: CpuState) -> list[np.ndarray]:
        """Every layer's arrays, views of the arena as the layer stores them (keys and values
        in their KV type, a recurrent layer's float32): their dtypes and shapes name the KV
        type and the context, which the arena's length alone would not (a float32 cache of n
        positions is as long as a float16 one of 2n)."""
        return [
            array
            for keys, values, arrays in zip(state.keys, state.values, state.arrays, strict=True)
            for array in (arrays if keys is None or values is None else (keys, values))
        ]

    def forget(self, state: CpuState, start: int, end: int) -> None:
        """Zero positions start .. end-1 of every attention layer: a ring's rows p % slots and
        their mirrors (all of them if the span covers the ring); from `start` 0, recurrent
        layers' arrays too (a fresh sequence). Otherwise recurrent layers are left as they
        are: forgetting positions of them is the engine's business (see the contract)."""
        for layer, keys, values, arrays in zip(state.layers, state.keys, state.values, state.arrays, strict=True):
            if not isinstance(layer, AttentionState) or keys is None or values is None or end <= start:
                for array in arrays if start == 0 and end > start else ():
                    array[:] = 0.0
                continue
            if not layer.ring:
                rows: Any = slice(start, end)
            else:
                held = np.unique(np.arange(start, min(end, start + layer.slots)) % layer.slots)
                rows = np.concatenate([held, held + layer.slots])
            keys[:, rows] = np.zeros((), keys.dtype)  # (Hkv, rows, Dh or its Q8_0 blocks)
            values[:, rows] = np.zeros((), values.dtype)  # (Hkv, rows, Dv or its Q8_0 blocks)

    def runner(self, forward: Forward) -> RecordingRunner:
        """Recorded passes where they pay (see `backends.cpu_runner`), the rest op by op."""
        return RecordingRunner(self, forward)

    def close(self) -> None:
        self._rope_tables.clear()
        self._sink_arrays.clear()
        self._gate_arrays.clear()


def _contiguous(x: Any) -> Any:
    return x if isinstance(x, Slot) else np.ascontiguousarray(x, dtype=np.float32)


def _rows(x: Any, rows: slice) -> Any:
    """Rows `rows` of an activation: all of it, or one row (a sequence of a batch)."""
    if rows.start == 0 and rows.stop == len(x):
        return x
    assert rows.stop - rows.start == 1, rows
    return _row(x, rows.start)


def _row(x: Any, b: int) -> Any:
    """Row b of an activation (a view), as x[b : b + 1]."""
    return x.row(b) if isinstance(x, Slot) else x[b : b + 1]
