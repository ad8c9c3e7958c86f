"""Opening a model file and making it ready to generate with."""

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from backends.base import Backend
from backends.errors import BackendError, BackendUnavailable
from backends.kv_types import DEFAULT_KV_TYPE, check_kv_type
from backends.selection import select
from engine.chat_template import ChatTemplate
from engine.config import ModelConfig
from engine.errors import BackendFailure, LoadCancelled, ModelFileError
from engine.gguf_file import GGUFFile, open_gguf
from engine.kv_cache import KVCache
from engine.models import build_model, read_config
from engine.models.common import Transformer
from engine.tokenizer import Tokenizer

DEFAULT_CONTEXT = 4096


@dataclass
class LoadedModel:
    """Everything needed to chat with one model file on one backend."""

    path: Path
    file: GGUFFile
    config: ModelConfig
    tokenizer: Tokenizer
    template: ChatTemplate
    backend: Backend
    model: Transformer
    backend_notes: list[str] = field(default_factory=list)  # why the other backends were passed over
    load_notes: list[str] = field(default_factory=list)  # what loading changed or left out (a type converted)

    def new_cache(self, n_ctx: int | None = None) -> KVCache:
        """A KV cache of `n_ctx` positions (default: 4096, capped at the model's own limit)."""
        limit = self.config.context_length
        n_ctx = min(n_ctx or DEFAULT_CONTEXT, limit) if limit else (n_ctx or DEFAULT_CONTEXT)
        return KVCache(self.model, n_ctx)

    def close(self) -> None:
        """Release the backend's memory and the file's memory map."""
        self.backend.close()
        self.file.close()


ProgressCallback = Callable[[float, str], None]


def load_model(
    path: str | Path | GGUFFile,
    backend: str = "auto",
    progress: ProgressCallback | None = None,
    cancel: threading.Event | None = None,
    threads: int | None = None,
    kv_type: str = DEFAULT_KV_TYPE,
) -> LoadedModel:
    """Validate and open a GGUF file, build its tokenizer, template and model on a backend.

    `path` may also be a GGUFFile the caller opened already (its header is not read
    again); the loaded model then owns it, and closes it if loading fails.

    `threads` sets the cpu backend's thread count (default: the physical cores); `kv_type`
    the number format of the KV cache ("f16", "q8_0" or "f32": `backends.kv_types`).
    `progress(fraction, stage)` follows the load from 0 to 1; setting `cancel` stops it
    between steps with LoadCancelled, releasing everything opened so far.
    Raises ModelFileError (bad or unsupported file) or BackendFailure (backend unusable,
    or not enough memory).
    """

    def step(fraction: float, stage: str) -> None:
        if cancel is not None and cancel.is_set():
            raise LoadCancelled(f"Loading {model_file.path.name} was cancelled.")
        if progress is not None:
            progress(fraction, stage)

    if progress is not None:
        progress(0.0, "Reading the model file")
    check_kv_type(kv_type)
    model_file = path if isinstance(path, GGUFFile) else open_gguf(path)
    chosen = None
    try:
        step(0.1, "Building the tokenizer")
        config = read_config(model_file)
        tokenizer = Tokenizer.from_metadata(model_file.metadata, source=model_file.path.name)
        template = ChatTemplate.from_metadata(model_file.metadata, origin=model_file.path.name)
        step(0.2, "Preparing the weights")
        try:
            chosen, notes = select(backend, threads)
        except BackendUnavailable as exc:
            raise BackendFailure(f"Cannot use the {backend} backend: {exc}") from exc
        try:
            model = build_model(
                config,
                model_file,
                chosen,
                on_weight=lambda done, total: step(0.2 + 0.8 * done / total, "Preparing the weights"),
            )
        except MemoryError as exc:
            raise BackendFailure(
                f"Not enough memory to load {model_file.path.name} on the {chosen.name} backend. "
                "Close other programs, or choose a smaller or more strongly quantized model."
            ) from exc
        except BackendError as exc:  # a tensor the backend cannot take: its bytes, its shape
            raise ModelFileError(f"Cannot load {model_file.path}: {exc}.") from exc
        kv_note = model.set_kv_type(kv_type)
        step(1.0, "Ready")
    except BaseException:
        if chosen is not None:
            chosen.close()
        model_file.close()
        raise
    load_notes = [*chosen.load_notes, *model.load_notes, *([kv_note] if kv_note else [])]
    return LoadedModel(model_file.path, model_file, config, tokenizer, template, chosen, model, notes, load_notes)
