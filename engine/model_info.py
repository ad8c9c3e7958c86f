"""What a model file is and what it needs: read from its header alone (no weights).

`describe_model` names a file's architecture, parameters (and, for a mixture of experts,
the active ones), quantization, size and context length; `ModelInfo.memory_verdict` weighs
the memory it needs on the backend that will run it (`backends.memory`) against the
memory available. The app's model picker shows these, and `engine.opening.open_model`
plans a load with them. Reading a header with a large vocabulary takes seconds.
"""

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import gguf

from backends.kv_types import DEFAULT_KV_TYPE
from backends.memory import Footprint, available_memory_bytes
from backends.selection import entry
from engine.builtin_templates import is_base_model
from engine.config import ModelConfig
from engine.gguf_file import GGUFFile, TensorInfo, open_gguf
from engine.models import read_config


@dataclass(frozen=True)
class ModelInfo:
    """What the picker shows about one model file."""

    path: Path
    name: str
    architecture: str
    parameters: int
    quantization: str
    file_size: int
    context_length: int
    weight_bytes_f32: int  # what the NumPy backend's float32 cache holds once loaded
    kv_bytes_per_token: int  # float32 keys and values of every layer, for one position
    active_parameters: int | None = None  # those one token reads, for a mixture of experts
    base_model: bool = False  # not tuned to chat (engine.builtin_templates.is_base_model): opened for completion
    vocabulary: dict = field(default_factory=dict, compare=False, repr=False)  # its tokenizer.ggml.* metadata

    def footprint(self, kv_type: str = DEFAULT_KV_TYPE) -> Footprint:
        """The sizes a backend's memory rule works from, with a KV cache of `kv_type`."""
        return Footprint(self.file_size, self.weight_bytes_f32, self.kv_bytes_per_token, self.context_length, kv_type)

    def memory_needed(self, n_ctx: int, backend: str = "numpy", kv_type: str = DEFAULT_KV_TYPE) -> int:
        """Bytes a load on `backend` needs with a KV cache of `n_ctx` positions of `kv_type`,
        by that backend's memory rule (`backends.memory`)."""
        return entry(backend).memory_rule.needed(self.footprint(kv_type), n_ctx)

    def can_run(self, n_ctx: int, available: int, kv_type: str = DEFAULT_KV_TYPE) -> bool:
        """Whether the file's pages and the KV cache fit in `available` bytes at all."""
        return self.file_size + self.footprint(kv_type).kv_bytes(n_ctx) <= available

    def memory_verdict(
        self, n_ctx: int, available: int, backend: str = "numpy", kv_type: str = DEFAULT_KV_TYPE
    ) -> tuple[bool, str]:
        """(fits, sentence) comparing the memory needed on `backend` with `available` bytes."""
        plan = entry(backend).memory_rule.plan(self.footprint(kv_type), n_ctx, available)
        text = f"needs {format_bytes(plan.needed)} of {format_bytes(available)} available"
        return plan.fits, f"{text}: {plan.caveat}" if plan.caveat else text


def format_bytes(n: int) -> str:
    """A byte count for people: '98.4 MB', '1.07 GB'."""
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.3g} {unit}" if n < 100 * size else f"{n / size:.0f} {unit}"
    return f"{n} B"


def describe_parameters(info: ModelInfo) -> str:
    """'135M', or for a mixture of experts '30.5B MoE, 3.3B active'."""
    if info.active_parameters is None:
        return format_parameters(info.parameters)
    return f"{format_parameters(info.parameters)} MoE, {format_parameters(info.active_parameters)} active"


def format_parameters(n: int) -> str:
    """A parameter count for people: '135M', '8.0B'."""
    return f"{n / 1e9:.1f}B" if n >= 1e9 else f"{n / 1e6:.0f}M"


def available_memory() -> int:
    """Bytes of memory the OS could give the app now (what the NumPy backend budgets from)."""
    return available_memory_bytes()


def read_model_info(path: str | Path, name: str | None = None) -> ModelInfo:
    """Describe a GGUF file from its header. Raises ModelFileError for bad files."""
    with open_gguf(path) as model_file:
        return describe_model(model_file, name)


def quantization_of(model_file: GGUFFile, matrices: list) -> str:
    """The file's quantization as its tensors show it.

    The type most of the layers' weights are stored in (by count), or the tensors' type
    where there are no layers. The file type in the metadata ("Q4_K_M") is used only when
    it agrees with that type, for the mix suffix it adds; a re-quantized file often keeps
    a stale one.
    """
    layers = [t for t in matrices if t.name.startswith("blk.")] or matrices
    by_type: dict[str, int] = {}
    for t in layers:
        by_type[t.type_name] = by_type.get(t.type_name, 0) + t.n_elements
    if not by_type:
        return "?"
    dominant = max(by_type, key=lambda name: by_type[name])
    file_type = model_file.get("general.file_type")
    if file_type in gguf.LlamaFileType._value2member_map_:
        named = gguf.LlamaFileType(file_type).name.removeprefix("MOSTLY_").removeprefix("ALL_")
        if re.sub(r"(_K)_[SML]$", r"\1", named) in by_type:  # Q4_K_M: mostly Q4_K, some others
            return named
    return dominant


def describe_model(model_file: GGUFFile, name: str | None = None) -> ModelInfo:
    """Describe an open GGUF file. Raises ModelFileError (UnsupportedModelError) for bad ones."""
    config = read_config(model_file)
    tensors = model_file.tensors.values()
    matrices = [t for t in tensors if len(t.shape) >= 2]
    quantization = quantization_of(model_file, matrices)
    kv_per_token = 4 * config.n_layers * config.n_kv_heads * (config.head_dim + config.value_head_dim)
    return ModelInfo(
        path=model_file.path,
        name=name or model_file.get("general.name") or model_file.path.stem,
        architecture=config.architecture,
        parameters=sum(t.n_elements for t in tensors),
        active_parameters=_active_parameters(config, tensors),
        quantization=quantization,
        file_size=model_file.size,
        context_length=config.context_length,
        weight_bytes_f32=4 * sum(t.n_elements for t in matrices),
        kv_bytes_per_token=kv_per_token,
        vocabulary=vocabulary_metadata(model_file.metadata),
        base_model=is_base_model(model_file.metadata, model_file.path.name),
    )


def _active_parameters(config: ModelConfig, tensors: Iterable[TensorInfo]) -> int | None:
    """The weights one token reads: all but the experts it does not choose (None: dense)."""
    if not config.n_experts:
        return None
    tensors = list(tensors)
    experts = sum(t.n_elements for t in tensors if "_exps." in t.name)
    idle = experts * (config.n_experts - config.n_experts_used) // config.n_experts
    return sum(t.n_elements for t in tensors) - idle


def vocabulary_metadata(metadata: dict) -> dict:
    """The metadata that says whether one model can draft for another (engine.draft_model)."""
    return {
        key: value
        for key, value in metadata.items()
        if key.startswith("tokenizer.ggml.") and key not in ("tokenizer.ggml.merges", "tokenizer.ggml.scores")
    }
