"""Model architectures, one file each, and the function that builds the right one."""

from collections.abc import Callable

from backends.base import Backend
from engine.config import ModelConfig
from engine.gguf_file import GGUFFile
from engine.models import gemma2, gemma3, llama, qwen2, qwen3
from engine.models.common import Transformer

ARCHITECTURES: dict[str, type[Transformer]] = {
    "llama": llama.Model,
    "qwen2": qwen2.Model,
    "qwen3": qwen3.Model,
    "gemma2": gemma2.Model,
    "gemma3": gemma3.Model,
}


def build_model(
    config: ModelConfig, model_file: GGUFFile, backend: Backend, on_weight: Callable[[int, int], None] | None = None
) -> Transformer:
    """Instantiate the architecture named by `config` with the file's weights on `backend`.

    `on_weight(done, total)` is called after each weight is prepared.
    """
    return ARCHITECTURES[config.architecture](config, model_file, backend, on_weight)
