"""Model architectures, one file each, and the one registry of them.

Each architecture file holds its `Family` (what it adds to the shared layout) as the
`family` of its `Model` class. Adding an architecture is adding its file and a line to
`ARCHITECTURES` (see docs/architecture.md).
"""

from collections.abc import Callable

from backends.base import Backend
from engine.config import ModelConfig
from engine.errors import UnsupportedModelError
from engine.gguf_file import GGUFFile
from engine.models import (
    bert,
    cohere2,
    command_r,
    gemma,
    gemma2,
    gemma3,
    gemma4,
    gemma_embedding,
    gpt_oss,
    granite,
    llama,
    olmo2,
    phi3,
    qwen2,
    qwen3,
    qwen3moe,
    qwen35,
    qwen35moe,
    smollm3,
    starcoder2,
)
from engine.models.common import Transformer

ARCHITECTURES: dict[str, type[Transformer]] = {
    "llama": llama.Model,
    "qwen2": qwen2.Model,
    "qwen3": qwen3.Model,
    "gemma2": gemma2.Model,
    "gemma3": gemma3.Model,
    "gemma4": gemma4.Model,
    "gemma-embedding": gemma_embedding.Model,
    "qwen3moe": qwen3moe.Model,
    "gpt-oss": gpt_oss.Model,
    "gemma": gemma.Model,
    "granite": granite.Model,
    "olmo2": olmo2.Model,
    "phi3": phi3.Model,
    "smollm3": smollm3.Model,
    "starcoder2": starcoder2.Model,
    "command-r": command_r.Model,
    "cohere2": cohere2.Model,
    "qwen35": qwen35.Model,
    "qwen35moe": qwen35moe.Model,
    "bert": bert.Model,
}
SUPPORTED_ARCHITECTURES = tuple(sorted(ARCHITECTURES))


def read_config(f: GGUFFile) -> ModelConfig:
    """The config of `f`, read with its architecture's family settings.

    Raises UnsupportedModelError for an architecture Sprig cannot run, and
    ModelFileError for a missing or inconsistent key or tensor.
    """
    model_class = ARCHITECTURES.get(f.architecture)
    if model_class is None:
        raise UnsupportedModelError(
            f"Cannot run {f.path}: its architecture is {f.architecture!r}, which Sprig does not support yet. "
            f'Supported architectures: {", ".join(SUPPORTED_ARCHITECTURES)} (the README\'s "Supported models" '
            "lists the models behind each)."
        )
    config = model_class.read_config(f)
    model_class.check_tensors(f, config)
    return config


def build_model(
    config: ModelConfig,
    model_file: GGUFFile,
    backend: Backend,
    on_weight: Callable[[int, int], None] | None = None,
) -> Transformer:
    """Instantiate the architecture named by `config` with the file's weights on `backend`.

    `on_weight(done, total)` is called after each weight is prepared.
    """
    return ARCHITECTURES[config.architecture](config, model_file, backend, on_weight)
