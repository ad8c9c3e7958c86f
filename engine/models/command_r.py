"""Command-R (Cohere, 35B and 104B "plus").

One LayerNorm (no bias) per layer, whose output goes to attention and to the MLP side by
side, both added to the residual; RoPE on adjacent pairs (Cohere's checkpoints interleave, and
the converter keeps them); q/k LayerNorms per head where the file has them (Command-R+); the
logits multiplied by the file's `logit_scale`.
"""

from engine.config import Family
from engine.models.common import Transformer
from engine.models.layer import ParallelLayer


class Model(Transformer):
    """A Command-R model."""

    family = Family(norm="layer", rope_neox=False)
    layer_class = ParallelLayer
