"""IBM Granite (3.x dense).

Llama's layout (its q/k rows permuted by the converter, so RoPE rotates adjacent pairs) with
four multipliers read from the file: the embeddings' (`embedding_scale`), each block's output
before the residual add (`residual_scale`), the attention scores' in place of
1/sqrt(head_dim) (`attention.scale`), and the logits divided by `logit_scale`.
"""

from engine.config import Family
from engine.models.common import Transformer


class Model(Transformer):
    """A Granite model."""

    family = Family(rope_neox=False, logit_scale_divides=True)
