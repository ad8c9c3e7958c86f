"""The blocks of the hybrid Qwen3.5 stack: the Gated DeltaNet (linear attention with a fixed
state), the gated full attention beside it, and their layer's norms.

- `GatedDeltaNet`: one projection gives the queries, keys and values (`attn_qkv`), which pass
  through a short causal convolution (`Backend.short_conv`, with its last inputs kept in the
  layer's state) and the gated delta rule (`Backend.delta_net`, with its (Hv, Dh, Dh) state
  matrices); the result is RMS-normed per head, gated by silu(z) (`attn_gate`, the gated RMS
  norm), and projected back (`ssm_out`).
- `GatedAttention`: full attention whose query projection also gives a gate per head
  (sigmoid(gate) multiplies the attention's output), with q/k norms and partial RoPE.
- `HybridLayer`: a pre-norm layer whose feed-forward norm the file calls
  `post_attention_norm` (llama.cpp's name for Qwen3.5's post_attention_layernorm).
"""

from typing import Any

from backends.base import Backend, DeltaNetLayer, PassInput, RecurrentState
from engine.config import ModelConfig
from engine.models.attention import Attention
from engine.models.block import Block, LayerPlan, LayerReader, TensorSpec
from engine.models.layer import DecoderLayer, _d_model


def _qk_width(c: ModelConfig) -> int:
    return c.delta_k_heads * c.delta_head_dim


def _v_width(c: ModelConfig) -> int:
    return c.delta_v_heads * c.delta_head_dim


def _conv_width(c: ModelConfig) -> int:
    return 2 * _qk_width(c) + _v_width(c)


class GatedDeltaNet(Block):
    """Linear attention by the gated delta rule, over a state of fixed size."""

    TENSORS = (
        TensorSpec("attn_qkv.weight", "w_qkv", lambda c: (_conv_width(c), c.d_model)),
        TensorSpec("attn_gate.weight", "w_z", lambda c: (_v_width(c), c.d_model)),
        TensorSpec("ssm_alpha.weight", "w_alpha", lambda c: (c.delta_v_heads, c.d_model)),
        TensorSpec("ssm_beta.weight", "w_beta", lambda c: (c.delta_v_heads, c.d_model)),
        TensorSpec("ssm_conv1d.weight", "conv", lambda c: (_conv_width(c), c.conv_kernel), host=True),
        TensorSpec("ssm_dt.bias", "dt_bias", lambda c: (c.delta_v_heads,), host=True),
        TensorSpec("ssm_a", "a", lambda c: (c.delta_v_heads,), host=True),
        TensorSpec("ssm_norm.weight", "norm", lambda c: (c.delta_head_dim,)),
        TensorSpec("ssm_out.weight", "w_out", lambda c: (c.d_model, _v_width(c))),
    )
    w_qkv: Any
    w_z: Any
    w_alpha: Any
    w_beta: Any
    conv: Any
    dt_bias: Any
    a: Any
    norm: Any
    w_out: Any

    def __init__(self, reader: LayerReader, plan: LayerPlan, index: int):
        cfg = self.config = plan.config
        self.backend: Backend = reader.backend
        self.index = index
        self.read_tensors(reader)
        self.settings = DeltaNetLayer(cfg.delta_k_heads, cfg.delta_v_heads, cfg.delta_head_dim, self.a, self.dt_bias)
        self.projections = self.backend.fuse_linear([self.w_qkv, self.w_z, self.w_alpha, self.w_beta])
        suffixes = ("attn_qkv.weight", "attn_gate.weight", "ssm_alpha.weight", "ssm_beta.weight")
        weights = (self.w_qkv, self.w_z, self.w_alpha, self.w_beta)
        self.linears = tuple(reader.linear(s, w) for s, w in zip(suffixes, weights, strict=True))
        self.out = reader.linear("ssm_out.weight", self.w_out)

    def state(self, n_ctx: int) -> RecurrentState:
        """The convolution's last K - 1 inputs (K - 1, C) and the state matrices (Hv, Dh, Dh)."""
        cfg = self.config
        heads, width = cfg.delta_v_heads, cfg.delta_head_dim
        return RecurrentState(((cfg.conv_kernel - 1, _conv_width(cfg)), (heads, width, width)))

    def __call__(self, h: Any, p: PassInput) -> Any:
        """The layer's output for `h` (T, D), its state carried on: (T, D)."""
        be, cfg, n = self.backend, self.config, len(p.positions)
        projected = be.linear_fused(h, self.projections, (None,) * 4)
        qkv, z, alpha, beta = (linear.adapt(h, y) for linear, y in zip(self.linears, projected, strict=True))
        states = [segment.state for segment in p.segments]
        x = be.short_conv(qkv, self.conv, states, self.index)  # (T, C)
        y = be.delta_net(x, alpha, beta, self.settings, states, self.index)  # (T, Hv * Dh)
        y = be.rms_norm(y.reshape(n, cfg.delta_v_heads, cfg.delta_head_dim), self.norm, cfg.norm_eps)  # (T, Hv, Dh)
        y = be.gated_activation(z, y.reshape(n, _v_width(cfg)), "silu")  # (T, Hv * Dh): the gated RMS norm
        return self.out(y)


class GatedAttention(Attention):
    """Attention whose query projection also gives, per head, a gate on its output."""

    TENSORS = tuple(
        TensorSpec(s.suffix, s.attribute, lambda c: (2 * c.n_heads * c.head_dim, c.d_model))
        if s.suffix == "attn_q.weight"
        else s
        for s in Attention.TENSORS
        if s.suffix not in ("attn_q.bias", "attn_sinks.weight")
    )
    bq = None
    sinks = None

    def fuse(self, reader: LayerReader) -> None:
        """The query and gate rows apart (each head's query rows, then its gate rows, in the
        file), then one product of query, gate, keys and values. (No adapters reach them.)"""
        cfg = self.config
        w_query, w_gate = reader.weight_interleaved("attn_q.weight", cfg.n_heads, [cfg.head_dim] * 2)
        self.qgkv = self.backend.fuse_linear([w_query, w_gate, self.wk, self.wv])

    def __call__(self, h: Any, p: PassInput) -> Any:
        """Attend `h` (T, D) over the state, each head's output gated: (T, D)."""
        be = self.backend
        q, gate, k, v = be.linear_fused(h, self.qgkv, (None, None, self.bk, self.bv))  # (T, H * Dh) ...
        out = be.gated_activation(gate, self.attend_projections(q, k, v, p), "sigmoid")  # (T, H * Dv)
        return self.o(out, self.bo)


class HybridLayer(DecoderLayer):
    """Pre-norm residual layer; the feed-forward block's norm is `post_attention_norm`."""

    TENSORS = (
        TensorSpec("attn_norm.weight", "attn_norm", _d_model),
        TensorSpec("post_attention_norm.weight", "ffn_norm", _d_model),
    )
