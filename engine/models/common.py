"""The decoder-only transformer that every architecture file specialises.

Written once against the backend contract (`backends/base.py`), so the same forward pass
runs on NumPy, MLX and CUDA. An architecture file says only how it differs: its
`Family` (which optional tensors it has, its activation, how its layers attend), and where
that is not enough, an override of `layer_rope` or `layer_attention`.
"""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from backends.base import Backend, LayerAttention, WeightSpec
from engine.config import LAYER_TENSORS, Family, ModelConfig
from engine.gguf_file import GGUFFile


@dataclass(frozen=True)
class LayerRope:
    """How one layer rotates its queries and keys."""

    base: float
    freq_factors: np.ndarray | None = None


@dataclass
class LayerWeights:
    """One transformer block's weights, as the backend prepared them. Optional ones are None."""

    attn_norm: Any
    wq: Any
    wk: Any
    wv: Any
    wo: Any
    ffn_norm: Any
    w_gate: Any
    w_up: Any
    w_down: Any
    bq: Any = None
    bk: Any = None
    bv: Any = None
    q_norm: Any = None
    k_norm: Any = None
    post_attn_norm: Any = None
    post_ffw_norm: Any = None
    qkv: Any = None  # wq, wk, wv joined by the backend's fuse_linear
    gate_up: Any = None  # w_gate, w_up joined the same way


@dataclass(frozen=True)
class KVBatch:
    """The KV storages of a batch of sequences, one new token each, and their positions
    (passed where one sequence passes its storage, see `Transformer.decode_batch`)."""

    storages: list[Any]
    positions: list[Any]  # host ints, or a backend's stand-ins while it records the pass


class Transformer:
    """A decoder-only transformer: embedding, N blocks, final norm, output projection.

    The features that tell families apart (activation, embedding scale, sliding windows,
    RoPE bases, soft-capping) come from the config, which `family` shaped; subclasses
    (one per architecture file) set `family`, and override `layer_rope` or
    `layer_attention` where that is not enough. Both are asked once per layer, at load.
    """

    family: ClassVar[Family]

    def __init__(
        self,
        config: ModelConfig,
        model_file: GGUFFile,
        backend: Backend,
        on_weight: Callable[[int, int], None] | None = None,
    ):
        """Prepare every weight on `backend`; `on_weight(done, total)` follows the progress.

        `on_weight` may raise (for example to cancel loading); the exception propagates.
        """
        self.config = config
        self.backend = backend
        self._file = model_file
        self._on_weight = on_weight
        self._prepared = 0
        self.token_embd = self._weight("token_embd.weight")
        self.output_norm = self._weight("output_norm.weight")
        self.output = self._weight("output.weight") if "output.weight" in model_file.tensors else self.token_embd
        self.layers = [self._layer(i) for i in range(config.n_layers)]
        self.ropes = [self.layer_rope(i) for i in range(config.n_layers)]
        self.attentions = [self.layer_attention(i) for i in range(config.n_layers)]

    # -- loading -----------------------------------------------------------------

    def _weight(self, name: str) -> Any:
        info = self._file.tensors[name]
        weight = self.backend.prepare_weight(WeightSpec(name, info.data, info.ggml_type, info.shape))
        self._prepared += 1
        if self._on_weight is not None:
            self._on_weight(self._prepared, len(self._file.tensors))
        return weight

    def _layer(self, i: int) -> LayerWeights:
        present = {
            tensor.field: self._weight(f"blk.{i}.{suffix}")
            for suffix, tensor in LAYER_TENSORS.items()
            if f"blk.{i}.{suffix}" in self._file.tensors
        }
        layer = LayerWeights(**present)
        layer.qkv = self.backend.fuse_linear([layer.wq, layer.wk, layer.wv])
        layer.gate_up = self.backend.fuse_linear([layer.w_gate, layer.w_up])
        return layer

    # -- what architectures override (called once per layer, at load) ----------------

    def layer_attention(self, i: int) -> LayerAttention:
        """Attention settings of layer i: scale, sliding window, soft-capping."""
        cfg = self.config
        window = cfg.sliding_window if cfg.is_sliding(i) else None
        return LayerAttention(cfg.attn_scale, window, cfg.attn_logit_softcap)

    def layer_rope(self, i: int) -> LayerRope:
        """RoPE base of layer i, with linear RoPE scaling as frequency divisors if the file asks."""
        cfg = self.config
        if cfg.rope_scaling_type == "linear" and cfg.rope_scaling_factor and not cfg.is_sliding(i):
            factors = np.full(cfg.rope_dim // 2, cfg.rope_scaling_factor, dtype=np.float32)
            return LayerRope(cfg.layer_rope_base(i), factors)
        return LayerRope(cfg.layer_rope_base(i))

    # -- forward -------------------------------------------------------------------

    def forward(self, token_ids: np.ndarray, start: int, kv_storage: Any, all_logits: bool = False) -> np.ndarray:
        """Run tokens at positions start.. through the model, filling the KV cache.

        Returns float32 logits on the host: (T, vocab) if `all_logits`, else (1, vocab)
        for the last position only. A single token goes through `decode_step`, a few tokens
        whose every logit is wanted (a speculative draft's verification) through the
        backend's compiled pass where it has one (`compile_forward`).
        """
        n = len(token_ids)
        if n == 1:
            logits = self.decode_step(kv_storage)(int(token_ids[0]), start)
        elif all_logits and n <= self.backend.max_compiled_tokens:
            step = self.backend.compile_forward(  # type: ignore[attr-defined]  # an optional hook
                lambda ids, positions, first: self.logits(ids, positions, first, kv_storage, all_logits=True),
                kv_storage,
                n,
                self,
            )
            logits = step(np.asarray(token_ids, dtype=np.int64), start)
        else:
            positions = np.arange(start, start + n)
            logits = self.logits(np.asarray(token_ids), positions, start, kv_storage, all_logits)
        return self.backend.to_host(logits)

    def decode_step(self, kv_storage: Any) -> Callable[[Any, int], Any]:
        """One-token forward passes on `kv_storage`: step(token, start) -> logits (1, vocab).

        The logits stay a backend tensor. `token` is a host int, or a backend tensor from
        the backend's optional `argmax` hook. A backend with the optional hook
        `compile_decode(forward, kv_storage)` fuses the step (MLX: one mx.compile'd
        function, queued without waiting for it), one with `compile_forward` replays its
        one-token pass (cpu); the others run `logits` op by op.
        """
        if self.backend.max_compiled_tokens:
            one = self.backend.compile_forward(  # type: ignore[attr-defined]  # an optional hook
                lambda ids, positions, first: self.logits(ids, positions, first, kv_storage), kv_storage, 1, self
            )
            return lambda token, start: one([token], start)
        compile_decode = getattr(self.backend, "compile_decode", None)
        if compile_decode is not None:
            return compile_decode(
                lambda ids, positions, start: self.logits(ids, positions, start, kv_storage), kv_storage
            )
        return lambda token, start: self.logits(np.asarray([token]), np.arange(start, start + 1), start, kv_storage)

    def decode_batch(self, token_ids: np.ndarray, positions: np.ndarray, kv_storages: list[Any]) -> Any:
        """One new token for each of B sequences, each at its own position of its own KV storage.

        `token_ids` (B,) and `positions` (B,) are host ints; sequence b attends only to
        `kv_storages[b]`. Returns backend logits (B, vocab). Embedding, norms, matrix
        products (one product over the B rows reads each weight once), RoPE and the MLP
        are row-wise; attention runs per sequence (`Backend.attention_batch`). One
        sequence goes through `decode_step`. Needs a backend with `batched_decode`.
        """
        if len(token_ids) == 1:
            return self.decode_step(kv_storages[0])(int(token_ids[0]), int(positions[0]))
        storages = list(kv_storages)
        compile_batch = getattr(self.backend, "compile_batch", None)
        if compile_batch is not None:  # recorded once per batch size (cpu)
            step = compile_batch(
                lambda ids, rows, starts: self.logits(ids, rows, None, KVBatch(storages, starts), all_logits=True),
                storages,
                self,
            )
            return step(np.asarray(token_ids, dtype=np.int64), np.asarray(positions, dtype=np.int64))
        batch = KVBatch(storages, [int(p) for p in positions])
        return self.logits(np.asarray(token_ids), np.asarray(positions), None, batch, all_logits=True)

    def logits(self, token_ids: Any, positions: Any, start: Any, kv_storage: Any, all_logits: bool = False) -> Any:
        """The forward pass on backend tensors: logits (T, vocab), or (1, vocab) for the last position.

        `token_ids` (T,), `positions` (T,) and `start` are host values, or the stand-ins a
        backend traces them as when it compiles a decode step (device arrays, and a start
        that its `attention` understands).
        """
        be, cfg = self.backend, self.config
        x = be.embedding(self.token_embd, token_ids, cfg.embedding_scale)  # (T, D)
        for i, layer in enumerate(self.layers):
            h = be.rms_norm(x, layer.attn_norm, cfg.rms_eps)
            h = self._attention(i, layer, h, positions, start, kv_storage)
            if layer.post_attn_norm is not None:
                h = be.rms_norm(h, layer.post_attn_norm, cfg.rms_eps)
            x = be.add(x, h)
            h = be.rms_norm(x, layer.ffn_norm, cfg.rms_eps)
            h = self._mlp(layer, h)
            if layer.post_ffw_norm is not None:
                h = be.rms_norm(h, layer.post_ffw_norm, cfg.rms_eps)
            x = be.add(x, h)
        if not all_logits:
            x = x[-1:]  # (1, D)
        x = be.rms_norm(x, self.output_norm, cfg.rms_eps)
        logits = be.linear(x, self.output)  # (T or 1, vocab)
        if cfg.final_logit_softcap:
            logits = be.softcap(logits, cfg.final_logit_softcap)
        return logits

    def _attention(self, i: int, layer: LayerWeights, h: Any, positions: Any, start: Any, kv_storage: Any) -> Any:
        be, cfg = self.backend, self.config
        n = len(positions)
        q, k, v = be.linear_fused(h, layer.qkv, (layer.bq, layer.bk, layer.bv))
        q = q.reshape(n, cfg.n_heads, cfg.head_dim)  # (T, H, Dh)
        k = k.reshape(n, cfg.n_kv_heads, cfg.head_dim)  # (T, Hkv, Dh)
        v = v.reshape(n, cfg.n_kv_heads, cfg.value_head_dim)  # (T, Hkv, Dv)
        if layer.q_norm is not None:
            q = be.rms_norm(q, layer.q_norm, cfg.rms_eps)
            k = be.rms_norm(k, layer.k_norm, cfg.rms_eps)
        rope = self.ropes[i]
        q = be.rope(q, positions, rope.base, cfg.rope_dim, cfg.rope_neox, rope.freq_factors)
        k = be.rope(k, positions, rope.base, cfg.rope_dim, cfg.rope_neox, rope.freq_factors)
        if isinstance(kv_storage, KVBatch):  # one token of each sequence, each on its own cache
            out = be.attention_batch(q, k, v, kv_storage.storages, i, kv_storage.positions, self.attentions[i])
        else:
            out = be.attention(q, k, v, kv_storage, i, start, self.attentions[i])  # (T, H * Dv)
        return be.linear(out, layer.wo)

    def _mlp(self, layer: LayerWeights, h: Any) -> Any:
        be = self.backend
        gate, up = be.linear_fused(h, layer.gate_up, (None, None))
        gated = be.gated_activation(gate, up, self.config.activation)
        return be.linear(gated, layer.w_down)
