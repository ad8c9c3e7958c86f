"""Gemma 3 (text).

As Gemma 2 (scaled embeddings, GELU, post-norms), plus:
- q/k norms; the (1 + w) form of its norms is folded into the file's weights by
  llama.cpp's converter (see engine/config.py);
- five sliding-window ("local") layers for each global one, the local layers with their
  own RoPE base (10000); linear RoPE scaling (larger models) on the global layers only;
- no soft-capping. Gemma 3 27B (62 layers) scales its queries by d_model / n_heads.
"""

from engine.config import Family
from engine.models.attention import QK_NORM
from engine.models.common import Transformer
from engine.models.layer import POST_NORMS


class Model(Transformer):
    """A Gemma 3 model."""

    family = Family(
        layer_tensors=POST_NORMS + QK_NORM,
        activation="gelu_tanh",
        scale_embeddings=True,
        sliding_window_pattern=6,
        rope_base_local=10000.0,
        d_model_query_scale_layers=62,
    )
