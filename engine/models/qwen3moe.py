"""Qwen3-MoE (Qwen3-30B-A3B, Qwen3-235B-A22B and their successors' text models).

Qwen3's attention (q/k norms) with a mixture of experts in place of the MLP: a softmax
over the router's logits, the top k experts (8 of 128 in the 30B), their weights divided by
their sum (llama.cpp always does so for this architecture; a file may say otherwise with
`expert_weights_norm`), each expert a SwiGLU.
"""

from typing import Any

from engine.config import Family, ModelConfig
from engine.models.attention import QK_NORM, Attention
from engine.models.common import Transformer
from engine.models.moe import MoEMLP


class Model(Transformer):
    """A Qwen3-MoE model."""

    family = Family(layer_tensors=QK_NORM, expert_routing="softmax_top_k")

    @classmethod
    def layer_blocks(cls, config: ModelConfig, i: int) -> tuple[type[Any], type[Any]]:
        """Attention, and a mixture of experts."""
        return Attention, MoEMLP
