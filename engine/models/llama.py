"""Llama 2/3, Mistral and SmolLM2.

The plain pre-norm transformer of `common`, with SiLU-gated MLPs. llama.cpp's converter
permutes the q/k rows of Llama checkpoints so that RoPE rotates adjacent pairs, which the
config records as `rope_neox=False`. Llama 3.1 files carry `rope_freqs.weight`, the
per-frequency divisors of its long-context RoPE scaling.
"""

from collections.abc import Callable

from backends.base import Backend
from engine.config import ModelConfig
from engine.gguf_file import GGUFFile
from engine.models.common import LayerRope, Transformer


class Model(Transformer):
    """A Llama-family model."""

    def __init__(
        self,
        config: ModelConfig,
        model_file: GGUFFile,
        backend: Backend,
        on_weight: Callable[[int, int], None] | None = None,
    ):
        super().__init__(config, model_file, backend, on_weight)
        factors = model_file.tensors.get("rope_freqs.weight")
        self._freq_factors = None if factors is None else factors.data.view("<f4")

    def layer_rope(self, i: int) -> LayerRope:
        if self._freq_factors is None:
            return super().layer_rope(i)
        return LayerRope(self.config.rope_base, self._freq_factors)
