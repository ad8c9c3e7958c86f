"""LoRA adapters from GGUF files, applied at run time beside the weights they adapt.

An adapter file is what llama.cpp's `convert_lora_to_gguf.py` writes: `general.type =
adapter`, `adapter.type = lora`, `adapter.lora.alpha`, and for each adapted matrix
`<base name>.lora_a` (r, n_in) and `<base name>.lora_b` (n_out, r) (NumPy order). Its
product is added beside the base weight's, never merged into the quantized blocks: each
adapted matrix's `Linear` (engine/models/block.py) holds the adapters' factors, prepared on
the backend as float32 matrices, and computes

    y = W x + scale * (alpha / r) * B (A x)

(with llama.cpp's convention that alpha 0 means a factor of `scale` alone).

A model's `AdapterStack` holds the adapters in use, each with its scale: `push`, `pop`,
`set_scale` and `clear` change them without reloading the model. Each change re-prepares the
factors of the matrices concerned, drops what the backend's runner recorded or compiled
(`Runner.reset`), and bumps `version`, by which a KV cache knows that the keys and values it
holds were computed under other adapters (it forgets them; see engine/kv_cache.py). A stale
recorded pass is never replayed, and a stale KV prefix never reused.
"""

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from backends.base import Backend, WeightSpec
from backends.dequant import dequantize
from engine.errors import SprigError
from engine.gguf_file import open_gguf
from engine.models.block import FusedLinear, Linear, LowRank

F32 = 0  # GGML type of the prepared factors


class AdapterError(SprigError):
    """An adapter file that is not a LoRA adapter, or one made for another base model."""


@dataclass(frozen=True)
class LoraAdapter:
    """A LoRA adapter read from its GGUF file: factors (A (r, n_in), B (n_out, r)) float32
    by the name of the base weight they adapt."""

    path: Path
    alpha: float
    architecture: str
    base_model: str | None
    factors: dict[str, tuple[np.ndarray, np.ndarray]]

    @property
    def name(self) -> str:
        return self.path.name


def read_adapter(path: str | Path) -> LoraAdapter:
    """Read a LoRA adapter GGUF (AdapterError for a file that is not one)."""
    path = Path(path)
    with open_gguf(path) as f:
        meta = f.metadata
        if meta.get("general.type") != "adapter" or meta.get("adapter.type") != "lora":
            kind = meta.get("general.type", "model")
            raise AdapterError(
                f"{path.name} is not a LoRA adapter (its general.type is {kind!r}, adapter.type "
                f"{meta.get('adapter.type')!r}); convert a PEFT adapter with llama.cpp's convert_lora_to_gguf.py."
            )
        pairs: dict[str, dict[str, np.ndarray]] = {}
        for name, info in f.tensors.items():
            base, _, part = name.rpartition(".")
            if part not in ("lora_a", "lora_b"):
                raise AdapterError(f"{path.name} holds the tensor {name!r}, which is no LoRA factor.")
            values = dequantize(info.data, info.ggml_type, info.shape).astype(np.float32, copy=True)
            pairs.setdefault(base, {})[part] = values
        factors = {}
        for base, pair in pairs.items():
            if set(pair) != {"lora_a", "lora_b"}:
                raise AdapterError(f"{path.name} has only one of the factors of {base!r}.")
            a, b = pair["lora_a"], pair["lora_b"]
            if a.ndim != 2 or b.ndim != 2 or a.shape[0] != b.shape[1]:
                raise AdapterError(f"{path.name}: the factors of {base!r} have shapes {a.shape} and {b.shape}.")
            factors[base] = (a, b)
        if not factors:
            raise AdapterError(f"{path.name} adapts no weight.")
        base_model = meta.get("general.base_model.0.name")
        return LoraAdapter(
            path, float(meta.get("adapter.lora.alpha", 0.0)), str(meta.get("general.architecture")), base_model, factors
        )


def parse_lora_option(text: str) -> tuple[str, float]:
    """`FILE[:SCALE]` (the --lora option) as (path, scale); a missing scale is 1."""
    path, sep, scale = text.rpartition(":")
    if sep and path and re.fullmatch(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?", scale):
        return path, float(scale)
    return text, 1.0


def _plain(name: str | None) -> str:
    return re.sub(r"[^a-z0-9]", "", (name or "").lower())


@dataclass
class ActiveAdapter:
    """An adapter in use, and its scale."""

    adapter: LoraAdapter
    scale: float


class AdapterStack:
    """The adapters a model runs with, in order, each with its scale.

    It is given what it adapts, not the model: the backend that prepares the factors, the
    model file's architecture and metadata (which base model it is), the matrices adapters
    may target by GGUF name, and `on_change`, called after every change (the model drops
    what its runner recorded or compiled)."""

    def __init__(
        self,
        backend: Backend,
        architecture: str,
        metadata: Mapping[str, Any],
        linears: Mapping[str, Linear | FusedLinear],
        on_change: Callable[[], None],
    ):
        self.backend, self.architecture, self.metadata = backend, architecture, metadata
        self.linears, self.on_change = linears, on_change
        self.active: list[ActiveAdapter] = []
        self.version = 0  # bumped at every change (KV caches compare it)

    def check(self, adapter: LoraAdapter) -> None:
        """AdapterError unless `adapter` fits this model: same architecture, the same base
        model where both files name it, and every factor on a matrix of the right shape."""
        architecture = self.architecture
        if adapter.architecture != architecture:
            raise AdapterError(
                f"{adapter.name} is an adapter for a {adapter.architecture!r} model; this model is {architecture!r}."
            )
        meta = self.metadata
        ours = {_plain(meta.get(key)) for key in ("general.basename", "general.name") if meta.get(key)}
        if adapter.base_model and ours and _plain(adapter.base_model) not in ours:
            raise AdapterError(
                f"{adapter.name} was made for {adapter.base_model!r}; this model is {meta.get('general.name')!r}."
            )
        for name, (a, b) in adapter.factors.items():
            linear = self.linears.get(name)
            if linear is None:
                raise AdapterError(
                    f"{adapter.name} adapts {name!r}, which this model does not have as a matrix Sprig can adapt "
                    f"(supported: attention and dense MLP projections, fused ones too, and the output head)."
                )
            n_out, n_in = linear.shape[0], linear.shape[-1]
            if a.shape[1] != n_in or b.shape[0] != n_out:
                raise AdapterError(
                    f"{adapter.name} is for another base model: its factors of {name!r} are {a.shape[1]} -> "
                    f"{b.shape[0]} wide, but this model's matrix is {n_in} -> {n_out}."
                )

    def push(self, adapter: LoraAdapter, scale: float = 1.0) -> int:
        """Apply `adapter` (after checking it) with `scale`, on top of the others; its index."""
        self.check(adapter)
        self.active.append(ActiveAdapter(adapter, float(scale)))
        self._apply()
        return len(self.active) - 1

    def pop(self) -> ActiveAdapter:
        """Remove the adapter pushed last."""
        if not self.active:
            raise AdapterError("no adapter is in use")
        out = self.active.pop()
        self._apply()
        return out

    def set_scale(self, index: int, scale: float) -> None:
        """Change the scale of adapter `index`."""
        self.active[index].scale = float(scale)
        self._apply()

    def use(self, wanted: Sequence[tuple[str | Path, float]]) -> None:
        """Make the adapters in use exactly `wanted` (file, scale), in order (the app's
        per-conversation adapters). Nothing changes where they already are; otherwise every
        file is read and checked before any is applied, so an AdapterError leaves the adapters
        as they were."""
        target = [(Path(path), float(scale)) for path, scale in wanted]
        if [(a.adapter.path, a.scale) for a in self.active] == target:
            return
        adapters = [read_adapter(path) for path, _ in target]
        for adapter in adapters:
            self.check(adapter)
        self.active = [ActiveAdapter(adapter, scale) for adapter, (_, scale) in zip(adapters, target, strict=True)]
        self._apply()

    def clear(self) -> None:
        """Remove every adapter: the model computes its base numbers again, bit for bit."""
        self.active.clear()
        self._apply()

    def _apply(self) -> None:
        backend = self.backend
        wanted: dict[Linear, list[LowRank]] = {}
        for i, active in enumerate(self.active):
            adapter = active.adapter
            for name, (a, b) in adapter.factors.items():
                rank = a.shape[0]
                factor = active.scale * adapter.alpha / rank if adapter.alpha else active.scale
                scaled = b * np.float32(factor)
                # names unique to this preparation: a backend may cache prepared weights by name
                tag = f"{name}.lora.{self.version + 1}.{i}"
                prepared_a = _prepare(backend, f"{tag}.a", a)
                for linear, rows in self.linears[name].parts():  # a fused tensor's parts: their rows of B
                    low_rank = LowRank(prepared_a, _prepare(backend, f"{tag}.b[{rows.start}]", scaled[rows]))
                    wanted.setdefault(linear, []).append(low_rank)
        for target in self.linears.values():
            for linear, _ in target.parts():
                linear.adapters = tuple(wanted.get(linear, ()))
        self.version += 1
        self.on_change()


def _prepare(backend, name: str, matrix: np.ndarray):
    matrix = np.ascontiguousarray(matrix, dtype=np.float32)
    return backend.prepare_weight(WeightSpec(name, matrix.reshape(-1).view(np.uint8), F32, matrix.shape))
