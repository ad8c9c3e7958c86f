"""Qwen3, and PrismML's 1-bit Bonsai models built on it.

Qwen2 without the q/k/v biases, plus an RMS norm over each head of the queries and keys
before RoPE (`attn_q_norm`, `attn_k_norm`), which the shared attention applies. Bonsai
differs only in its weights' type (Q1_0).
"""

from engine.config import Family
from engine.models.attention import QK_NORM
from engine.models.common import Transformer


class Model(Transformer):
    """A Qwen3-family model: everything it needs is in the shared blocks."""

    family = Family(layer_tensors=QK_NORM)
