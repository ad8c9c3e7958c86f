"""gpt-oss (OpenAI's open-weight MoE models, 20B and 120B).

- Attention with biases on q, k, v and the output, a learned sink logit per head, and
  128-token sliding windows on every other layer (even layers), full attention between;
  NeoX RoPE with YaRN scaling (factor 32 over a 4096-token original context in the
  published files).
- A mixture of experts: a router with a bias, the top 4 of 32 logits and a softmax over
  those, each expert a clamped SwiGLU (`swiglu_oai`) with biases; the expert weights are
  MXFP4 in the published files.
- The norm before the feed-forward block is called `post_attention_norm` in its files.
"""

from typing import Any

from engine.config import Family, ModelConfig
from engine.models.attention import QKV_BIAS, Attention
from engine.models.block import TensorSpec
from engine.models.common import Transformer
from engine.models.layer import DecoderLayer
from engine.models.moe import MoEMLP


class GptOssLayer(DecoderLayer):
    """A pre-norm layer whose second norm has gpt-oss's name."""

    TENSORS = (
        TensorSpec("attn_norm.weight", "attn_norm", lambda c: (c.d_model,)),
        TensorSpec("post_attention_norm.weight", "ffn_norm", lambda c: (c.d_model,)),
    )


class Model(Transformer):
    """A gpt-oss model."""

    family = Family(
        layer_tensors=(*QKV_BIAS, "attn_output.bias", "attn_sinks.weight", "ffn_gate_inp.bias"),
        activation="swiglu_oai",
        sliding_window_pattern=2,
        expert_routing="top_k_softmax",
    )
    layer_class = GptOssLayer

    @classmethod
    def layer_blocks(cls, config: ModelConfig, i: int) -> tuple[type[Any], type[Any]]:
        """Attention with sinks, and a mixture of experts."""
        return Attention, MoEMLP
