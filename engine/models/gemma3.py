"""Gemma 3 (text).

Everything Gemma 3 does differently is a config feature the shared blocks read:
- embeddings scaled by sqrt(d_model), GELU (tanh approximation) instead of SiLU;
- q/k norms, and norms after attention and after the MLP; the (1 + w) form of its norms
  is folded into the file's weights by llama.cpp's converter;
- five sliding-window ("local") layers for each global one, the local layers with their
  own RoPE base (10000); linear RoPE scaling (larger models) on the global layers only.
"""

from engine.models.common import Transformer


class Model(Transformer):
    """A Gemma 3 model."""
