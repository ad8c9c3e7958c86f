"""Gemma 2.

Gemma 3's older sibling, expressed through config features as well: scaled embeddings,
GELU and the extra post-norms, but no q/k norms, local and global layers alternating
(even layers are local), one RoPE base for all layers, and soft-capping of attention
scores (50) and of the final logits (30).
"""

from engine.models.common import Transformer


class Model(Transformer):
    """A Gemma 2 model."""
