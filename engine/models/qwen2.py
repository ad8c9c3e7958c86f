"""Qwen2 and Qwen2.5.

The `common` transformer with biases on the q, k and v projections, and NeoX-style RoPE
(rotating halves, as Hugging Face's checkpoints are laid out).
"""

from engine.config import Family
from engine.models.attention import QKV_BIAS
from engine.models.common import Transformer


class Model(Transformer):
    """A Qwen2-family model: everything it needs is in the shared blocks."""

    family = Family(layer_tensors=QKV_BIAS)
