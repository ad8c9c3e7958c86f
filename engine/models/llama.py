"""Llama 2/3, Mistral and SmolLM2.

The plain pre-norm transformer of `common`, with SiLU-gated MLPs. llama.cpp's converter
permutes the q/k rows of Llama checkpoints so that RoPE rotates adjacent pairs
(`rope_neox=False`). Llama 3.1 files carry `rope_freqs.weight`, the per-frequency
divisors of its long-context RoPE scaling, which every layer uses.
"""

from engine.config import Family
from engine.models.common import Transformer
from engine.models.rope_scaling import LayerRope


class Model(Transformer):
    """A Llama-family model."""

    family = Family(rope_neox=False)

    def layer_rope(self, i: int) -> LayerRope | None:
        """The file's `rope_freqs.weight` divisors where it has them, else the shared rule."""
        factors = self._file.tensors.get("rope_freqs.weight")
        if factors is None:
            return super().layer_rope(i)
        return LayerRope(self.config.rope_base, factors.data.view("<f4"))
