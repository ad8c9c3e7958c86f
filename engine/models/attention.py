"""Self-attention as a block: q/k/v projections (with optional biases and q/k norms),
rotary positions, attention over the layer's own state, and the output projection.

The one attention every architecture shares. What tells families apart is data, set once
per layer at load: the RoPE base and frequency divisors (`engine.models.rope_scaling.LayerRope`), the scale, window
and soft-cap (`backends.base.LayerAttention`), and which optional tensors the file has.
"""

from dataclasses import replace
from typing import Any, ClassVar

import numpy as np

from backends.base import AttentionState, Backend, LayerAttention, PassInput
from engine.config import ModelConfig
from engine.models.block import Block, LayerPlan, LayerReader, TensorSpec
from engine.models.layer import norm
from engine.models.rope_scaling import LayerRope

QKV_BIAS = ("attn_q.bias", "attn_k.bias", "attn_v.bias")
QK_NORM = ("attn_q_norm.weight", "attn_k_norm.weight")
RING_SLACK = 1024
"""Positions a windowed layer keeps beyond its window: the most new tokens one pass may
write, and the most a rollback may forget, before the cache must read the text again
(`engine.kv_cache.KVCache`). Answers regenerated or drafts rejected stay well within it."""


def _qk_norm(c: ModelConfig, heads: int) -> tuple[int, ...]:
    """A q or k norm's weight: one head's width, or the whole projection's (OLMo 2)."""
    return (heads * c.head_dim,) if c.qk_norm_whole else (c.head_dim,)


class Attention(Block):
    """Grouped-query self-attention with rotary positions over one layer's KV state."""

    TENSORS: ClassVar[tuple[TensorSpec, ...]] = (
        TensorSpec("attn_q.weight", "wq", lambda c: (c.n_heads * c.head_dim, c.d_model)),
        TensorSpec("attn_k.weight", "wk", lambda c: (c.n_kv_heads * c.head_dim, c.d_model)),
        TensorSpec("attn_v.weight", "wv", lambda c: (c.n_kv_heads * c.value_head_dim, c.d_model)),
        TensorSpec("attn_output.weight", "wo", lambda c: (c.d_model, c.n_heads * c.value_head_dim)),
        TensorSpec("attn_q.bias", "bq", lambda c: (c.n_heads * c.head_dim,), optional=True),
        TensorSpec("attn_k.bias", "bk", lambda c: (c.n_kv_heads * c.head_dim,), optional=True),
        TensorSpec("attn_v.bias", "bv", lambda c: (c.n_kv_heads * c.value_head_dim,), optional=True),
        TensorSpec("attn_q_norm.weight", "q_norm", lambda c: _qk_norm(c, c.n_heads), optional=True),
        TensorSpec("attn_k_norm.weight", "k_norm", lambda c: _qk_norm(c, c.n_kv_heads), optional=True),
        TensorSpec("attn_output.bias", "bo", lambda c: (c.d_model,), optional=True),
        TensorSpec("attn_sinks.weight", "sinks", lambda c: (c.n_heads,), optional=True, host=True),
    )
    wq: Any
    wk: Any
    wv: Any
    wo: Any
    bq: Any
    bk: Any
    bv: Any
    q_norm: Any
    k_norm: Any
    bo: Any
    sinks: np.ndarray | None

    def __init__(self, reader: LayerReader, plan: LayerPlan, index: int):
        self.backend: Backend = reader.backend
        self.config: ModelConfig = plan.config
        self.index = index
        self.rope: LayerRope | None = plan.layer_rope(index)  # None: this layer uses no positions
        self.settings: LayerAttention = plan.layer_attention(index)
        self.read_tensors(reader)
        if self.sinks is not None:
            self.settings = replace(self.settings, sinks=self.sinks)
        self.fuse(reader)
        self.o = reader.linear("attn_output.weight", self.wo)

    def fuse(self, reader: LayerReader) -> None:
        """Join the matrices on the layer's input for one product (`Backend.fuse_linear`), and
        register each for adapters."""
        self.qkv = self.backend.fuse_linear([self.wq, self.wk, self.wv])
        self.read_linears(reader)

    def read_linears(self, reader: LayerReader) -> None:
        """The `Linear`s adapters reach: q, k, v (`qkv_linears`) and the output (`o`)."""
        suffixes = ("attn_q.weight", "attn_k.weight", "attn_v.weight")
        self.qkv_linears = tuple(
            reader.linear(s, w) for s, w in zip(suffixes, (self.wq, self.wk, self.wv), strict=True)
        )

    def state(self, n_ctx: int) -> AttentionState:
        """This layer's KV state for a context of `n_ctx` positions (`kv_state`)."""
        return kv_state(self.config, self.settings.window, n_ctx, self.settings.causal)

    def pass_rope(self, p: PassInput) -> LayerRope | None:
        """How this pass rotates: the layer's RoPE (a family whose rotation depends on the
        context, as Phi-3's LongRoPE, chooses here)."""
        return self.rope

    def __call__(self, h: Any, p: PassInput) -> Any:
        """Attend `h` (T, D) over the state, writing the new keys and values: (T, D)."""
        q, k, v = self.backend.linear_fused(h, self.qkv, (self.bq, self.bk, self.bv))
        q, k, v = (linear.adapt(h, y) for linear, y in zip(self.qkv_linears, (q, k, v), strict=True))  # LoRA
        return self.o(self.attend_projections(q, k, v, p), self.bo)

    def attend_projections(self, q: Any, k: Any, v: Any, p: PassInput) -> Any:
        """The attention of the projections q (T, H * Dh), k (T, Hkv * Dh), v (T, Hkv * Dv)
        over the state, after their norms and rotation: (T, H * Dv), before the output matrix."""
        be, cfg, n = self.backend, self.config, len(p.positions)
        if self.q_norm is not None and cfg.qk_norm_whole:  # OLMo 2: over the whole projection
            q, k = norm(be, cfg, q, self.q_norm), norm(be, cfg, k, self.k_norm)
        q = q.reshape(n, cfg.n_heads, cfg.head_dim)  # (T, H, Dh)
        k = k.reshape(n, cfg.n_kv_heads, cfg.head_dim)  # (T, Hkv, Dh)
        v = v.reshape(n, cfg.n_kv_heads, cfg.value_head_dim)  # (T, Hkv, Dv)
        if self.q_norm is not None and not cfg.qk_norm_whole:  # per head
            q, k = norm(be, cfg, q, self.q_norm), norm(be, cfg, k, self.k_norm)
        rope = self.pass_rope(p)
        if rope is not None:
            q = be.rope(q, p.positions, rope.base, cfg.rope_dim, cfg.rope_neox, rope.freq_factors, rope.mscale)
            k = be.rope(k, p.positions, rope.base, cfg.rope_dim, cfg.rope_neox, rope.freq_factors, rope.mscale)
        return attend(be, q, k, v, p, self.index, self.settings)


def kv_state(cfg: ModelConfig, window: int | None, n_ctx: int, causal: bool = True) -> AttentionState:
    """The KV state of a layer of `cfg`'s shape for a context of `n_ctx` positions: all of them,
    or, for a sliding window smaller than the context, a ring of the window and RING_SLACK more
    (never for bidirectional attention, whose queries see later positions too)."""
    ring = window is not None and causal and window + RING_SLACK - 1 < n_ctx
    slots = window + RING_SLACK - 1 if ring and window is not None else n_ctx
    return AttentionState(cfg.n_kv_heads, cfg.head_dim, cfg.value_head_dim, slots, window if ring else None, n_ctx)


def attend(be: Backend, q: Any, k: Any, v: Any, p: PassInput, layer: int, settings: LayerAttention) -> Any:
    """The attention of layer `layer` for the pass `p`, writing its new keys and values: over
    one sequence's state, or one token of each sequence over its own (T, H * Dv)."""
    if len(p.segments) == 1:
        segment = p.segments[0]
        return be.attention(q, k, v, segment.state, layer, segment.start, settings)  # (T, H * Dv)
    states, starts = [s.state for s in p.segments], [s.start for s in p.segments]
    return be.attention_batch(q, k, v, states, layer, starts, settings)  # (B, H * Dv)
