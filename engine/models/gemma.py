"""Gemma (the first generation, 2B and 7B).

Llama's layout with Gemma's habits: embeddings scaled by sqrt(d_model), a GELU-gated MLP
(tanh approximation), NeoX RoPE, and norms of the form (1 + w), which llama.cpp's converter
stores as w + 1 (see engine/config.py). No post-norms, soft-caps or sliding windows: those
came with Gemma 2.
"""

from engine.config import Family
from engine.models.common import Transformer


class Model(Transformer):
    """A Gemma model."""

    family = Family(activation="gelu_tanh", scale_embeddings=True)
