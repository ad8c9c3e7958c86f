"""OLMo 2 (AI2).

No norm before attention or the MLP; an RMS norm after each (`post_attention_norm`,
`post_ffw_norm`) before its residual add, and RMS norms over the whole q and k projections
(not per head) before RoPE (NeoX). OLMo 3's sliding-window layers are not covered.
"""

from engine.config import Family
from engine.models.attention import QK_NORM
from engine.models.common import Transformer
from engine.models.layer import PostNormLayer


class Model(Transformer):
    """An OLMo 2 model."""

    family = Family(layer_tensors=QK_NORM, qk_norm_whole=True)
    layer_class = PostNormLayer
