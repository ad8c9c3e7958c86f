"""StarCoder2 (BigCode, 3B-15B).

LayerNorms with biases (before attention, before the MLP, and at the end), biases on q, k,
v and the output projection, NeoX RoPE, and an MLP without a gate: GELU (tanh approximation)
between `ffn_up` and `ffn_down`, both with biases. The models were trained with a sliding
window, which llama.cpp's converter does not write: a file carries none, and none is applied.
"""

from typing import Any

from engine.config import Family, ModelConfig
from engine.models.attention import QKV_BIAS, Attention
from engine.models.common import Transformer
from engine.models.mlp import PlainMLP


class Model(Transformer):
    """A StarCoder2 model."""

    family = Family(
        layer_tensors=(*QKV_BIAS, "attn_output.bias", "attn_norm.bias", "ffn_norm.bias"),
        activation="gelu_tanh",
        norm="layer",
    )

    @classmethod
    def layer_blocks(cls, config: ModelConfig, i: int) -> tuple[type[Any], type[Any]]:
        """Attention, and an MLP without a gate."""
        return Attention, PlainMLP
