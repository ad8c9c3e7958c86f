"""What every part of a layer shares: the tensors it reads, reading them, and what it asks of
the model that builds it.

A layer is built from blocks (`engine.models.attention.Attention`,
`engine.models.mlp.DenseMLP`, the norms of `engine.models.layer.DecoderLayer`). Each
block class lists the per-layer GGUF tensors it reads in `TENSORS`: their names after
`blk.{i}.`, their attributes on the block, their shapes. That table is what the loader
checks a file against before any weight is read (`check_layer_tensors`), and what the
block reads its weights by (`LayerReader`). A block is built as `block(reader, plan, i)`:
`plan` (`LayerPlan`) is all it may ask of the model that holds it, which it never imports.
"""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import numpy as np

from backends.base import Backend, LayerAttention, WeightSpec
from backends.dequant import dequantize
from engine.config import ModelConfig, bad_file, required_tensor
from engine.gguf_file import GGUFFile, TensorInfo
from engine.models.rope_scaling import LayerRope


class LayerPlan(Protocol):
    """What a block asks of the model building it, once, at load: the model's config, and
    how layer i rotates positions and attends (what the architecture decided for it).
    `engine.models.common.Transformer` is one."""

    @property
    def config(self) -> ModelConfig:
        """The model's config."""
        ...

    def layer_rope(self, i: int) -> LayerRope | None:
        """How layer i rotates its queries and keys; None where it uses no positions."""
        ...

    def layer_attention(self, i: int) -> LayerAttention:
        """Layer i's attention settings: scale, sliding window, soft-capping."""
        ...


@dataclass(frozen=True)
class TensorSpec:
    """One per-layer GGUF tensor a block reads: its name after `blk.{i}.`, the block's
    attribute that holds it, its shape, and whether every file has it."""

    suffix: str
    attribute: str
    shape: Callable[[ModelConfig], tuple[int, ...]]  # (n_out, n_in) for matrices
    optional: bool = False  # read where the file has it; a family may require it
    host: bool = False  # kept as a float32 NumPy array (a setting of an op), not prepared by the backend


@dataclass(frozen=True)
class LowRank:
    """One adapter's factors on one weight, prepared on the backend as float32 matrices:
    `a` (r, n_in), and `b` (n_out, r) with the adapter's scale * alpha / r folded in."""

    a: Any
    b: Any


class Linear:
    """A weight as the blocks multiply by it: the prepared base weight, and the low-rank
    adapters (LoRA) on it, applied beside it at run time and never merged into its blocks:

        y = W x (+ bias) + sum over adapters of  scale * (alpha / r) * B (A x)

    The factors are multiplied with the backend's own `linear` and added with its `add`, so
    every backend and runner (op by op, recorded, compiled, batched) runs them as any other
    op. With no adapter this is `backend.linear` and nothing more.
    """

    def __init__(self, backend: Backend, name: str, weight: Any, shape: tuple[int, ...]):
        self.backend, self.name, self.weight, self.shape = backend, name, weight, shape
        self.adapters: tuple[LowRank, ...] = ()

    def __call__(self, x: Any, bias: Any = None) -> Any:
        """x (T, n_in) -> (T, n_out)."""
        return self.adapt(x, self.backend.linear(x, self.weight, bias))

    def adapt(self, x: Any, y: Any) -> Any:
        """`y`, the base product of `x` (T, n_in), plus every adapter's low-rank product."""
        be = self.backend
        for factors in self.adapters:
            y = be.add(y, be.linear(be.linear(x, factors.a), factors.b))  # (T, r) -> (T, n_out)
        return y

    def parts(self) -> tuple[tuple["Linear", slice], ...]:
        """The matrices an adapter on this weight adapts, each with its rows of the adapter's
        B: this one, with all of them."""
        return ((self, slice(0, self.shape[0])),)


class FusedLinear:
    """A fused tensor cut by rows into parts at load (Phi-3's attn_qkv, ffn_up), as adapters
    see it: an adapter on the whole tensor adapts each part with that part's rows of B (A
    is shared)."""

    def __init__(self, name: str, shape: tuple[int, ...], parts: tuple[tuple[Linear, slice], ...]):
        self.name, self.shape, self._parts = name, shape, parts

    def parts(self) -> tuple[tuple[Linear, slice], ...]:
        """Each part's `Linear` and its rows of the whole tensor."""
        return self._parts


class Block:
    """A part of a layer that owns its weights, read from its own tensors (`TENSORS`)."""

    TENSORS: ClassVar[tuple[TensorSpec, ...]] = ()

    def read_tensors(self, reader: "LayerReader") -> None:
        """Set each attribute of `TENSORS` to its prepared weight, or None where an optional
        tensor is absent."""
        for spec in self.TENSORS:
            setattr(self, spec.attribute, (reader.host_weight if spec.host else reader.weight)(spec.suffix))


class LayerReader:
    """Prepares the weights of layer `index` of a file on a backend, counting them for the
    loading progress (`on_weight(done, total)`, which may raise to cancel)."""

    def __init__(self, model_file: GGUFFile, backend: Backend, on_weight: Callable[[int, int], None] | None = None):
        self.file, self.backend, self.on_weight = model_file, backend, on_weight
        self.prepared = 0
        self.index = 0
        self.linears: dict[str, Linear | FusedLinear] = {}  # every matrix an adapter may target, by GGUF name

    def at(self, index: int) -> "LayerReader":
        """This reader, reading layer `index` from now on."""
        self.index = index
        return self

    def weight(self, suffix: str) -> Any:
        """The prepared weight `blk.{index}.{suffix}`, or None if the file has no such tensor."""
        name = f"blk.{self.index}.{suffix}"
        return self.global_weight(name) if name in self.file.tensors else None

    def weight_rows(self, suffix: str, rows: list[int]) -> list[Any]:
        """The matrix `blk.{index}.{suffix}` cut by rows into parts of `rows` rows each (a
        fused tensor: Phi-3's qkv), each prepared as a matrix of its own over the same bytes."""
        name = f"blk.{self.index}.{suffix}"
        info = self.file.tensors[name]
        n_rows, n_cols = info.shape
        row_bytes = info.data.size // n_rows
        parts, first = [], 0
        for count in rows:
            raw = info.data.reshape(-1)[first * row_bytes : (first + count) * row_bytes]
            parts.append(
                self.backend.prepare_weight(
                    WeightSpec(f"{name}[{first}:{first + count}]", raw, info.ggml_type, (count, n_cols))
                )
            )
            first += count
        self._count()
        return parts

    def expert_halves(self, suffix: str) -> tuple[Any, Any]:
        """The experts' tensor `blk.{index}.{suffix}` (E, 2F, D) of fused gate and up matrices
        (Gemma 4's ffn_gate_up_exps) as two prepared (E, F, D) weights: each expert's first F
        rows, and its last F. Both are copies in memory (a half of every expert is not one run
        of the file), so they cost their size in RAM besides the mapped file."""
        name = f"blk.{self.index}.{suffix}"
        info = self.file.tensors[name]
        n_experts, rows, cols = info.shape
        half = rows // 2
        blocks = info.data.reshape(n_experts, rows, -1)  # (E, 2F, bytes per row)
        gate, up = (
            self.backend.prepare_weight(
                WeightSpec(
                    f"{name}[{part}]",
                    np.ascontiguousarray(blocks[:, first : first + half]).reshape(-1),
                    info.ggml_type,
                    (n_experts, half, cols),
                )
            )
            for part, first in (("gate", 0), ("up", half))
        )
        self._count()
        return gate, up

    def weight_interleaved(self, suffix: str, groups: int, sizes: list[int]) -> list[Any]:
        """The matrix `blk.{index}.{suffix}` whose rows form `groups` groups of consecutive
        parts of `sizes` rows each (Qwen3.5's joint query and gate: per head, its query rows then
        its gate rows), as one prepared matrix per part, its rows gathered from every group in order."""
        name = f"blk.{self.index}.{suffix}"
        info = self.file.tensors[name]
        n_rows, n_cols = info.shape
        rows = info.data.reshape(groups, n_rows // groups, -1)  # (groups, rows per group, row bytes)
        parts: list[Any] = []
        first = 0
        for count in sizes:
            raw = np.ascontiguousarray(rows[:, first : first + count]).reshape(-1)  # (groups * count * row bytes,)
            spec = WeightSpec(f"{name}[part {len(parts)}]", raw, info.ggml_type, (groups * count, n_cols))
            parts.append(self.backend.prepare_weight(spec))
            first += count
        self._count()
        return parts

    def linear(self, suffix: str, weight: Any) -> Linear:
        """The `Linear` of the prepared weight `blk.{index}.{suffix}`, registered under its
        name for adapters (`engine.lora`)."""
        return self.global_linear(f"blk.{self.index}.{suffix}", weight)

    def global_linear(self, name: str, weight: Any) -> Linear:
        """The `Linear` of the prepared weight `name`, registered for adapters where the file has
        a tensor of that name (the parts of a fused tensor are registered by `linear_rows`)."""
        info = self.file.tensors.get(name)
        linear = Linear(self.backend, name, weight, info.shape if info is not None else ())
        if info is not None:
            self.linears[name] = linear
        return linear

    def linear_rows(self, suffix: str, rows: list[int]) -> list[Linear]:
        """The `Linear` of each part of the fused matrix `blk.{index}.{suffix}` cut by `rows`
        (`weight_rows`); the whole is registered for adapters as a `FusedLinear`."""
        name = f"blk.{self.index}.{suffix}"
        n_rows, n_cols = self.file.tensors[name].shape
        parts, first = [], 0
        for weight, count in zip(self.weight_rows(suffix, rows), rows, strict=True):
            linear = Linear(self.backend, f"{name}[{first}:{first + count}]", weight, (count, n_cols))
            parts.append((linear, slice(first, first + count)))
            first += count
        self.linears[name] = FusedLinear(name, (n_rows, n_cols), tuple(parts))
        return [linear for linear, _ in parts]

    def host_weight(self, suffix: str) -> np.ndarray | None:
        """The tensor `blk.{index}.{suffix}` as float32 on the host, or None if the file has none."""
        info = self.file.tensors.get(f"blk.{self.index}.{suffix}")
        return None if info is None else dequantize(info.data, info.ggml_type, info.shape)

    def optional_weight(self, name: str) -> Any:
        """The prepared weight `name` outside the layers, or None if the file has none."""
        return self.global_weight(name) if name in self.file.tensors else None

    def global_weight(self, name: str, shape: tuple[int, ...] | None = None) -> Any:
        """The prepared weight `name` (a tensor outside the layers, or a whole name), with
        `shape` in place of the file's where given (a vector read as a one-row matrix)."""
        info = self.file.tensors[name]
        weight = self.backend.prepare_weight(WeightSpec(name, info.data, info.ggml_type, shape or info.shape))
        self._count()
        return weight

    def _count(self) -> None:
        """One more tensor prepared: the loading progress."""
        self.prepared += 1
        if self.on_weight is not None:
            self.on_weight(self.prepared, len(self.file.tensors))


def check_layer_tensors(
    f: GGUFFile,
    config: ModelConfig,
    layer_blocks: Callable[[int], tuple[type[Block], ...]],
    required: tuple[str, ...],
    layer_config: Callable[[int], ModelConfig] | None = None,
    final_norm: bool = True,
) -> None:
    """Check that every layer has each tensor its blocks need (`required` names the optional
    ones this architecture needs too) with the shape `config` implies (or `layer_config(i)`,
    where layers differ in shape: Gemma 4), that the tensors it has beyond those have theirs,
    and the final norm where the model has one. Raises ModelFileError naming the first one
    that does not."""
    expected: dict[str, tuple[int, ...]] = {"output_norm.weight": (config.d_model,)} if final_norm else {}
    if not config.tie_embeddings:
        expected["output.weight"] = (config.vocab_size, config.d_model)
    for name, shape in expected.items():
        _check_shape(f, required_tensor(f, name), name, shape)
    for layer in range(config.n_layers):  # stops at the first missing tensor, however many layers are claimed
        shapes = config if layer_config is None else layer_config(layer)
        for block in layer_blocks(layer):
            for spec in block.TENSORS:
                name = f"blk.{layer}.{spec.suffix}"
                if name in f.tensors or not spec.optional or spec.suffix in required:
                    _check_shape(f, required_tensor(f, name), name, spec.shape(shapes))


def _check_shape(f: GGUFFile, info: TensorInfo, name: str, shape: tuple[int, ...]) -> None:
    if info.shape != shape:
        bad_file(f, f"the tensor {name!r} has shape {info.shape}, but the metadata implies {shape}")
