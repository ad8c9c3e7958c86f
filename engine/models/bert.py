"""BERT (`bert`): the encoder behind most embedding models RAG tools default to
(all-MiniLM, bge, e5), as llama.cpp's converter writes it.

- Embeddings: the token's row, plus the position's row of `position_embd` (absolute
  positions, at most the context length), plus row 0 of `token_types` (every token is of
  "sentence A", as llama.cpp), then a LayerNorm with bias (`token_embd_norm`).
- Layers normed after each residual add: x = LN(x + attention(x)), then x = LN(x + MLP(x)),
  every LayerNorm with its bias (`attn_output_norm`, `layer_output_norm`).
- Attention bidirectional, without RoPE, with biases on q, k, v and the output; an MLP
  without a gate, with biases, GELU in its tanh form (as llama.cpp's ggml_gelu; transformers
  uses the erf form, which differs by less than 1e-3).
- No norm after the last layer, and no output head: the file is for embeddings only (CLS or
  mean pooling, as its `pooling_type` says).
"""

from typing import Any, ClassVar

from backends.base import LayerAttention, PassInput
from engine.config import Family, ModelConfig, bad_file, required_tensor
from engine.gguf_file import GGUFFile
from engine.models.attention import Attention
from engine.models.block import LayerReader, TensorSpec
from engine.models.common import Transformer
from engine.models.layer import DecoderLayer, _d_model, norm
from engine.models.mlp import PlainMLP
from engine.models.rope_scaling import LayerRope

EMBEDDING_NORM = ("token_embd_norm.weight", "token_embd_norm.bias")


class PostResidualNormLayer(DecoderLayer):
    """x = LN(x + mixer(x)), then LN(x + feed_forward(x)): the original Transformer's order."""

    TENSORS: ClassVar[tuple[TensorSpec, ...]] = (
        TensorSpec("attn_output_norm.weight", "mixer_norm", _d_model),
        TensorSpec("attn_output_norm.bias", "mixer_norm_bias", _d_model),
        TensorSpec("layer_output_norm.weight", "output_norm", _d_model),
        TensorSpec("layer_output_norm.bias", "output_norm_bias", _d_model),
    )
    mixer_norm: Any
    mixer_norm_bias: Any
    output_norm: Any
    output_norm_bias: Any

    def __call__(self, x: Any, p: PassInput) -> Any:
        """The residual stream `x` (T, D) after this layer: (T, D)."""
        be, cfg = self.backend, self.config
        x = norm(be, cfg, be.add(x, self.mixer(x, p)), self.mixer_norm, self.mixer_norm_bias)
        return norm(be, cfg, be.add(x, self.feed_forward(x, p)), self.output_norm, self.output_norm_bias)


class Model(Transformer):
    """A BERT encoder."""

    family = Family(activation="gelu_tanh", norm="layer")
    layer_class = PostResidualNormLayer
    causal = False
    final_norm = False

    @classmethod
    def layer_blocks(cls, config: ModelConfig, i: int) -> tuple[type[Any], type[Any]]:
        """Attention, and an MLP without a gate."""
        return Attention, PlainMLP

    @classmethod
    def check_tensors(cls, f: GGUFFile, config: ModelConfig) -> None:
        """The layers' tensors, and the embeddings' own: positions (one row for each position
        of the context) and their norm."""
        super().check_tensors(f, config)
        positions = required_tensor(f, "position_embd.weight")
        if tuple(positions.shape) != (config.context_length, config.d_model):
            bad_file(f, f"position_embd.weight has shape {positions.shape}, not the context by {config.d_model}")
        for name in EMBEDDING_NORM:
            required_tensor(f, name)

    def layer_rope(self, i: int) -> LayerRope | None:
        """None: positions come from `position_embd`, not from rotations."""
        return None

    def layer_attention(self, i: int) -> LayerAttention:
        """Bidirectional attention over the whole text."""
        return LayerAttention(self.config.attn_scale, causal=False)

    def read_extra(self, reader: LayerReader) -> None:
        """The position and token-type tables, and the embeddings' LayerNorm."""
        self.positions = reader.global_weight("position_embd.weight")
        self.token_types = reader.optional_weight("token_types.weight")
        self.embedding_norm, self.embedding_norm_bias = (reader.global_weight(n) for n in EMBEDDING_NORM)

    def embed(self, p: PassInput) -> Any:
        """LN(token + position + token type 0): (T, D)."""
        be = self.backend
        x = be.add(be.embedding(self.token_embd, p.tokens), be.embedding(self.positions, p.positions))  # (T, D)
        if self.token_types is not None:
            x = be.add(x, be.embedding(self.token_types, p.tokens * 0))  # (T, D): row 0 for every token
        return norm(be, self.config, x, self.embedding_norm, self.embedding_norm_bias)
