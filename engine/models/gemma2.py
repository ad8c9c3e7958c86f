"""Gemma 2.

Gemma 3's older sibling: embeddings scaled by sqrt(d_model), GELU (tanh approximation),
norms after attention and after the MLP too, but no q/k norms; local (sliding-window) and
global layers alternate, even layers local, with one RoPE base for all; attention scores
soft-capped at 50 and the final logits at 30 (Gemma 2's published defaults, used where
the file has no value). Gemma 2 27B (46 layers) scales its queries by d_model / n_heads.
"""

from engine.config import Family
from engine.models.common import Transformer
from engine.models.layer import POST_NORMS


class Model(Transformer):
    """A Gemma 2 model."""

    family = Family(
        layer_tensors=POST_NORMS,
        activation="gelu_tanh",
        scale_embeddings=True,
        sliding_window_pattern=2,
        attn_logit_softcap=50.0,
        final_logit_softcap=30.0,
        d_model_query_scale_layers=46,
    )
