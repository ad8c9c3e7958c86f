"""Qwen2 and Qwen2.5.

The `common` transformer with biases on the q, k and v projections (loaded because the
file has them) and NeoX-style RoPE, which the config records as `rope_neox=True`.
"""

from engine.models.common import Transformer


class Model(Transformer):
    """A Qwen2-family model: everything it needs is in the shared blocks."""
