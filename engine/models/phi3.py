"""Phi-3, Phi-3.5 and Phi-4-mini (Microsoft's `phi3`).

Llama's layout with two fused tensors: q, k and v in one `attn_qkv` (their rows in that
order), gate and up in one `ffn_up` (gate first), cut into their parts at load, where their
bytes lie. Partial NeoX RoPE (`rope.dimension_count` of each head) with LongRoPE: the file's
`rope_factors_short` and `rope_factors_long` divide the frequencies, the long ones where the
context the conversation runs in is longer than the original one
(`rope.scaling.original_context_length`), as llama.cpp chooses (transformers chooses by the
length of each pass instead, and so differs from both past that length); `rope.scaling.attn_factor`
scales the rotated features of queries and keys. A sliding window applies to every
layer where the file sets one (Phi-3-mini's 2047); Phi-4-mini's files set 0, none.
"""

from typing import Any

from backends.base import PassInput
from backends.dequant import dequantize
from engine.config import Family, ModelConfig
from engine.gguf_file import GGUFFile
from engine.models.attention import Attention
from engine.models.block import LayerReader, TensorSpec
from engine.models.common import Transformer
from engine.models.mlp import DenseMLP
from engine.models.rope_scaling import LayerRope


class FusedAttention(Attention):
    """Attention whose q, k and v come from one fused matrix, and whose RoPE factors follow
    the conversation's context (LongRoPE)."""

    TENSORS = (
        TensorSpec("attn_qkv.weight", "wqkv", lambda c: ((c.n_heads + 2 * c.n_kv_heads) * c.head_dim, c.d_model)),
        TensorSpec("attn_output.weight", "wo", lambda c: (c.d_model, c.n_heads * c.head_dim)),
    )

    def __init__(self, reader: LayerReader, model: "Model", index: int):
        self.long_rope, self.original_context = model.long_rope, model.config.rope_original_context
        super().__init__(reader, model, index)

    def read_tensors(self, reader: LayerReader) -> None:
        """q, k and v as parts of `attn_qkv`; no biases, norms or sinks."""
        cfg = self.config
        heads = (cfg.n_heads, cfg.n_kv_heads, cfg.n_kv_heads)
        self.fused_qkv = reader.linear_rows("attn_qkv.weight", [h * cfg.head_dim for h in heads])
        self.wq, self.wk, self.wv = (linear.weight for linear in self.fused_qkv)
        self.wo = reader.weight("attn_output.weight")
        self.bq = self.bk = self.bv = self.bo = self.q_norm = self.k_norm = self.sinks = None

    def read_linears(self, reader: LayerReader) -> None:
        """q, k and v adapted as parts of `attn_qkv` (an adapter on it reaches them)."""
        self.qkv_linears = tuple(self.fused_qkv)
        self.o = reader.linear("attn_output.weight", self.wo)

    def pass_rope(self, p: PassInput) -> LayerRope | None:
        """The short factors, or the long ones in a context longer than the original."""
        if self.long_rope is not None and p.segments[0].state.layers[self.index].context > self.original_context:
            return self.long_rope
        return self.rope


class FusedMLP(DenseMLP):
    """A gated MLP whose gate and up are the two halves of one `ffn_up` (gate first)."""

    TENSORS = (
        TensorSpec("ffn_up.weight", "w_gate_up", lambda c: (2 * c.d_ff, c.d_model)),
        TensorSpec("ffn_down.weight", "w_down", lambda c: (c.d_model, c.d_ff)),
    )

    def __init__(self, reader: LayerReader, model: "Model", index: int):
        self.d_ff = model.config.d_ff
        super().__init__(reader, model, index)

    def read_tensors(self, reader: LayerReader) -> None:
        """Gate and up as the halves of `ffn_up`."""
        self.gate, self.up = reader.linear_rows("ffn_up.weight", [self.d_ff, self.d_ff])
        self.w_gate, self.w_up = self.gate.weight, self.up.weight
        self.w_down = reader.weight("ffn_down.weight")

    def read_linears(self, reader: LayerReader) -> None:
        """Gate and up adapted as the halves of `ffn_up` (an adapter on it reaches them)."""
        self.down = reader.linear("ffn_down.weight", self.w_down)


class Model(Transformer):
    """A Phi-3 model."""

    family = Family(all_layers_slide=True)

    def __init__(self, config: ModelConfig, model_file: GGUFFile, *args: Any, **kwargs: Any):
        self.short_factors = _factors(model_file, "rope_factors_short.weight")
        long_factors = _factors(model_file, "rope_factors_long.weight")
        mscale = config.rope_attn_factor
        self.long_rope = None if long_factors is None else LayerRope(config.rope_base, long_factors, mscale)
        super().__init__(config, model_file, *args, **kwargs)

    @classmethod
    def layer_blocks(cls, config: ModelConfig, i: int) -> tuple[type[Any], type[Any]]:
        """Attention from a fused qkv, an MLP from a fused gate and up."""
        return FusedAttention, FusedMLP

    def layer_rope(self, i: int) -> LayerRope | None:
        """The short LongRoPE factors (the long ones are chosen per pass), or plain RoPE."""
        return LayerRope(self.config.rope_base, self.short_factors, self.config.rope_attn_factor)


def _factors(model_file: GGUFFile, name: str) -> Any:
    """A LongRoPE factor tensor (rope_dim / 2,) float32, or None where the file has none."""
    info = model_file.tensors.get(name)
    return None if info is None else dequantize(info.data, info.ggml_type, info.shape)
