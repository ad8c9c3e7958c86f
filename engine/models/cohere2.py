"""Command R7B and Command A (Cohere's `cohere2`).

Command-R's parallel layer (one LayerNorm, attention and MLP side by side) with interleaved
sliding windows: three local layers, then a global one. Only the local layers use RoPE; the
global ones attend without positions.
"""

from engine.config import Family
from engine.models.common import Transformer
from engine.models.layer import ParallelLayer


class Model(Transformer):
    """A Command R7B model."""

    family = Family(norm="layer", rope_neox=False, sliding_window_pattern=4, rope_on_sliding_only=True)
    layer_class = ParallelLayer
