"""Gemma 4 (text): the dense models (31B, E2B, E4B) and the mixture of experts (26B-A4B).

As transformers' Gemma4ForCausalLM and llama.cpp's `gemma4` graph (src/models/gemma4.cpp):
- Sliding-window ("local") and global layers in the file's own pattern
  (`attention.sliding_window_pattern`, one flag per layer), each kind with its own head size
  (`attention.key_length_swa`, `attention.key_length`), key/value heads (`head_count_kv`, one
  per layer), RoPE base (`rope.freq_base_swa`, `rope.freq_base`) and rotated width. The global
  layers use "proportional" RoPE: the whole head is rotated, with `rope_freqs.weight` (1, or
  1e30 for the pairs that stay put) as frequency divisors, so only a quarter of it turns.
- q and k RMS-normed per head with weights, v without; queries unscaled (1.0). A global layer
  without `attn_v` uses its keys as values (`attention_k_eq_v`: 26B-A4B, 31B).
- The last `attention.shared_kv_layers` layers (E2B, E4B) compute no keys or values: each
  attends over those of the last earlier layer of its kind. Here each keeps its own copy of
  them (the same numbers, written in the same pass), so every layer's state stays its own.
- A norm after each block, and a scalar after the layer (`layer_output_scale`).
- The feed-forward block: a GELU MLP (twice as wide in E2B's KV-sharing layers, where
  `feed_forward_length` is a list), or beside it a mixture of experts (26B-A4B), each branch
  with its own norms; the router reads the RMS-normed residual times its `ffn_gate_inp.scale`
  / sqrt(d_model); a softmax, the top k, renormalised, times a scale per expert.
- Per-layer input embeddings (E2B, E4B): a second embedding of width n_layers * P and a
  projection of the scaled embedding, normed per layer, summed and halved in variance; each
  layer adds proj(gelu(gate(x)) * its P columns), normed.
- Embeddings scaled by sqrt(d_model), final logits soft-capped (`final_logit_softcapping`).

llama.cpp writes a `Gemma4ForConditionalGeneration`'s vision and audio towers into a separate
mmproj file, which Sprig does not read; a file that holds them anyway loads with a note that
they are left unread (`load_notes`).
"""

import copy
import math
from dataclasses import dataclass, replace
from typing import Any, ClassVar

import numpy as np

from backends.base import AttentionState, Backend, ExpertWeights, LayerAttention, PassInput, Routing, WeightSpec
from engine.config import Family, ModelConfig, bad_file, required_tensor
from engine.gguf_file import GGUFFile
from engine.models.attention import attend, kv_state
from engine.models.block import Block, LayerReader, TensorSpec, check_layer_tensors
from engine.models.common import Transformer
from engine.models.layer import DecoderLayer, norm
from engine.models.mlp import DenseMLP
from engine.models.rope_scaling import LayerRope

GGML_F32 = 0
PER_LAYER_INPUT = ("inp_gate.weight", "proj.weight", "post_norm.weight")
TOWERS = ("v.", "a.", "mm.")  # llama.cpp's names of the vision and audio towers' tensors


@dataclass(frozen=True)
class Gemma4Config(ModelConfig):
    """A Gemma 4 file's config: the shared fields describe its global layers; these, what
    differs per layer."""

    sliding: tuple[bool, ...] = ()  # per layer: a sliding-window layer
    kv_heads: tuple[int, ...] = ()  # per layer
    ffn: tuple[int, ...] = ()  # per layer: the MLP's width
    head_dim_local: int = 0  # of the sliding-window layers
    rope_dim_local: int = 0
    shared_kv_layers: int = 0  # the last this many layers reuse earlier keys and values
    per_layer_input: int = 0  # width of each layer's input embedding (0: none)

    def is_sliding(self, layer: int) -> bool:
        """Whether `layer` attends within the sliding window, as the file's pattern says."""
        return self.sliding[layer]

    def layer_config(self, layer: int) -> ModelConfig:
        """The config with `layer`'s own head size, key/value heads, rotated width and MLP width."""
        head = self.head_dim_local if self.sliding[layer] else self.head_dim
        return replace(
            self,
            n_kv_heads=self.kv_heads[layer],
            head_dim=head,
            value_head_dim=head,
            rope_dim=self.rope_dim_local if self.sliding[layer] else self.rope_dim,
            d_ff=self.ffn[layer],
        )

    def kv_source(self, layer: int) -> int:
        """The layer whose keys and values `layer` attends over: itself, or for a KV-sharing
        layer the last layer of its kind before the sharing ones."""
        first_shared = self.n_layers - self.shared_kv_layers
        if layer < first_shared:
            return layer
        return max(i for i in range(first_shared) if self.sliding[i] == self.sliding[layer])


def _per_layer_ints(f: GGUFFile, suffix: str, n_layers: int) -> tuple[int, ...]:
    """A key that is one positive whole number, or one per layer."""
    value = f.arch_key(suffix)
    values = value if isinstance(value, list) else [value] * n_layers
    if len(values) != n_layers or any(isinstance(v, bool) or not isinstance(v, int) or v <= 0 for v in values):
        bad_file(
            f, f"{f.architecture}.{suffix} should be a positive whole number or one per layer, not {str(value)[:60]}"
        )
    return tuple(values)


class Gemma4Attention(Block):
    """Self-attention that computes its own keys and values (normed; values are the keys where
    the file has no `attn_v`), over its layer's state."""

    TENSORS: ClassVar[tuple[TensorSpec, ...]] = (
        TensorSpec("attn_q.weight", "wq", lambda c: (c.n_heads * c.head_dim, c.d_model)),
        TensorSpec("attn_output.weight", "wo", lambda c: (c.d_model, c.n_heads * c.head_dim)),
        TensorSpec("attn_q_norm.weight", "q_norm", lambda c: (c.head_dim,)),
        TensorSpec("attn_k.weight", "wk", lambda c: (c.n_kv_heads * c.head_dim, c.d_model)),
        TensorSpec("attn_k_norm.weight", "k_norm", lambda c: (c.head_dim,)),
        TensorSpec("attn_v.weight", "wv", lambda c: (c.n_kv_heads * c.head_dim, c.d_model), optional=True),
    )
    wq: Any
    wo: Any
    q_norm: Any
    wk: Any = None
    k_norm: Any = None
    wv: Any = None

    def __init__(self, reader: LayerReader, model: "Model", index: int):
        self.backend: Backend = reader.backend
        self.index = index
        self.config = model.config.layer_config(index)
        self.source = model.config.layer_config(model.config.kv_source(index))  # whose keys it attends over
        self.kind = "local" if model.config.sliding[index] else "global"
        self.rope: LayerRope = model.layer_rope(index)
        self.settings = model.layer_attention(index)
        self.read_tensors(reader)
        own = [w for w in (self.wq, self.wk, self.wv) if w is not None]
        suffixes = ("attn_q.weight", "attn_k.weight", "attn_v.weight")[: len(own)]
        self.projections = self.backend.fuse_linear(own)
        self.linears = tuple(reader.linear(s, w) for s, w in zip(suffixes, own, strict=True))
        self.o = reader.linear("attn_output.weight", self.wo)
        ones = np.ones(self.config.head_dim, dtype=np.float32)
        self.v_norm = self.backend.prepare_weight(
            WeightSpec(f"blk.{index}.attn_v_norm (ones)", ones.view(np.uint8), GGML_F32, ones.shape)
        )

    def state(self, n_ctx: int) -> AttentionState:
        """The keys and values of its source layer's shape (`kv_state`)."""
        return kv_state(self.source, self.settings.window, n_ctx)

    def __call__(self, h: Any, p: PassInput, shared: dict[str, tuple[Any, Any]] | None = None) -> Any:
        """Attend `h` (T, D) over the state, writing the new keys and values; `shared` holds
        each kind's keys and values of this pass for the KV-sharing layers: (T, D)."""
        be, cfg, n = self.backend, self.config, len(p.positions)
        shared = {} if shared is None else shared
        outs = be.linear_fused(h, self.projections, (None,) * len(self.linears))
        outs = [linear.adapt(h, y) for linear, y in zip(self.linears, outs, strict=True)]  # LoRA
        q = outs[0].reshape(n, cfg.n_heads, cfg.head_dim)  # (T, H, Dh)
        q = be.rope(
            norm(be, cfg, q, self.q_norm), p.positions, self.rope.base, cfg.rope_dim, True, self.rope.freq_factors
        )
        if self.wk is not None:
            k = outs[1].reshape(n, cfg.n_kv_heads, cfg.head_dim)  # (T, Hkv, Dh)
            v = outs[2].reshape(n, cfg.n_kv_heads, cfg.head_dim) if self.wv is not None else k  # (T, Hkv, Dh)
            v = be.rms_norm(v, self.v_norm, cfg.norm_eps)
            k = be.rope(
                norm(be, cfg, k, self.k_norm), p.positions, self.rope.base, cfg.rope_dim, True, self.rope.freq_factors
            )
            shared[self.kind] = (k, v)
        else:  # a KV-sharing layer: the keys and values its source layer made in this pass
            k, v = shared[self.kind]
        return self.o(attend(be, q, k, v, p, self.index, self.settings))  # (T, H * Dh) -> (T, D)


class SharedKVAttention(Gemma4Attention):
    """A KV-sharing layer's attention: queries and output only (E2B, E4B)."""

    TENSORS = Gemma4Attention.TENSORS[:3]


class Gemma4MLP(DenseMLP):
    """The dense feed-forward block with its norm before it."""

    TENSORS = (TensorSpec("ffn_norm.weight", "ffn_norm", lambda c: (c.d_model,)), *DenseMLP.TENSORS)
    ffn_norm: Any

    def __init__(self, reader: LayerReader, model: "Model", index: int):
        super().__init__(reader, model, index)
        self.norm_config = model.config

    def __call__(self, x: Any, p: PassInput) -> Any:
        """The MLP of the normed residual `x` (T, D): (T, D)."""
        return super().__call__(norm(self.backend, self.norm_config, x, self.ffn_norm), p)


def _experts(c: ModelConfig) -> tuple[int, ...]:
    return (c.n_experts, c.d_expert, c.d_model)


class Gemma4MoE(Gemma4MLP):
    """The dense MLP and a mixture of experts side by side, each between its own norms (26B-A4B)."""

    TENSORS = (
        *Gemma4MLP.TENSORS,
        TensorSpec("post_ffw_norm_1.weight", "post_mlp_norm", lambda c: (c.d_model,)),
        TensorSpec("pre_ffw_norm_2.weight", "pre_moe_norm", lambda c: (c.d_model,)),
        TensorSpec("post_ffw_norm_2.weight", "post_moe_norm", lambda c: (c.d_model,)),
        TensorSpec("ffn_gate_inp.weight", "router", lambda c: (c.n_experts, c.d_model)),
        TensorSpec("ffn_gate_inp.scale", "router_scale", lambda c: (c.d_model,), host=True),
        TensorSpec("ffn_down_exps.weight", "down_exps", lambda c: (c.n_experts, c.d_model, c.d_expert)),
        TensorSpec("ffn_down_exps.scale", "expert_scale", lambda c: (c.n_experts,), optional=True, host=True),
        TensorSpec("ffn_gate_exps.weight", "gate_exps", _experts, optional=True),
        TensorSpec("ffn_up_exps.weight", "up_exps", _experts, optional=True),
        TensorSpec(
            "ffn_gate_up_exps.weight", "gate_up", lambda c: (c.n_experts, 2 * c.d_expert, c.d_model), optional=True
        ),
    )
    FUSED = "ffn_gate_up_exps.weight"  # read as its two halves (`LayerReader.expert_halves`)
    post_mlp_norm: Any
    pre_moe_norm: Any
    post_moe_norm: Any
    router: Any
    router_scale: np.ndarray
    down_exps: Any
    expert_scale: np.ndarray | None
    gate_exps: Any
    up_exps: Any

    def __init__(self, reader: LayerReader, model: "Model", index: int):
        super().__init__(reader, model, index)
        cfg = model.config
        if self.gate_exps is None:
            self.gate_exps, self.up_exps = reader.expert_halves(self.FUSED)
        # the router reads rms_norm(x) * scale / sqrt(D): one weighted RMS norm
        scale = (self.router_scale / np.float32(math.sqrt(cfg.d_model))).astype(np.float32)
        self.router_norm = self.backend.prepare_weight(
            WeightSpec(f"blk.{index}.ffn_gate_inp.scale / sqrt(d_model)", scale.view(np.uint8), GGML_F32, scale.shape)
        )
        per_expert = None if self.expert_scale is None else np.ascontiguousarray(self.expert_scale, dtype=np.float32)
        self.routing = Routing(cfg.n_experts, cfg.n_experts_used, "softmax_top_k", cfg.expert_weights_norm, per_expert)
        self.experts = ExpertWeights(self.gate_exps, self.up_exps, self.down_exps)

    def read_tensors(self, reader: LayerReader) -> None:
        """Every tensor of `TENSORS` but the fused gate and up one, which is read as its halves."""
        for spec in self.TENSORS:
            if spec.suffix != self.FUSED:
                setattr(self, spec.attribute, (reader.host_weight if spec.host else reader.weight)(spec.suffix))

    def __call__(self, x: Any, p: PassInput) -> Any:
        """post_1(mlp(norm(x))) + post_2(experts(pre_2(x))) for the residual `x` (T, D): (T, D)."""
        be, cfg = self.backend, self.norm_config
        mlp = norm(be, cfg, super().__call__(x, p), self.post_mlp_norm)
        logits = be.linear(be.rms_norm(x, self.router_norm, cfg.norm_eps), self.router)  # (T, E)
        choice = be.route(logits, self.routing)  # (T, 2k): experts, then weights
        moe = be.experts(norm(be, cfg, x, self.pre_moe_norm), choice, self.experts, cfg.activation)  # (T, D)
        return be.add(mlp, norm(be, cfg, moe, self.post_moe_norm))


def _per_layer_input(c: ModelConfig) -> int:
    assert isinstance(c, Gemma4Config)
    return c.per_layer_input


class Gemma4Layer(DecoderLayer):
    """x + post(attention(norm(x))), then + post(feed-forward(x)), then + the per-layer input's
    branch where the file has them, all times the layer's scalar."""

    TENSORS = (
        TensorSpec("attn_norm.weight", "attn_norm", lambda c: (c.d_model,)),
        TensorSpec("post_attention_norm.weight", "post_attn_norm", lambda c: (c.d_model,)),
        TensorSpec("post_ffw_norm.weight", "post_ffw_norm", lambda c: (c.d_model,)),
        TensorSpec("layer_output_scale.weight", "output_scale", lambda c: (1,), optional=True, host=True),
        TensorSpec("inp_gate.weight", "input_gate", lambda c: (_per_layer_input(c), c.d_model), optional=True),
        TensorSpec("proj.weight", "input_proj", lambda c: (c.d_model, _per_layer_input(c)), optional=True),
        TensorSpec("post_norm.weight", "input_norm", lambda c: (c.d_model,), optional=True),
    )
    output_scale: np.ndarray | None
    input_gate: Any
    input_proj: Any
    input_norm: Any
    mixer: Gemma4Attention

    def __init__(self, reader: LayerReader, config: ModelConfig, mixer: Any, feed_forward: Any):
        super().__init__(reader, config, mixer, feed_forward)
        self.scalar = 1.0 if self.output_scale is None else float(self.output_scale[0])
        if self.input_gate is not None:
            self.gate = reader.linear("inp_gate.weight", self.input_gate)
            self.proj = reader.linear("proj.weight", self.input_proj)

    def __call__(
        self, x: Any, p: PassInput, shared: dict[str, tuple[Any, Any]] | None = None, extra: Any = None
    ) -> Any:
        """The residual stream `x` (T, D) after this layer: (T, D). `shared` carries each kind's
        keys and values of this pass to the KV-sharing layers; `extra` is the layer's per-layer
        input (T, P), where the file has them."""
        be, cfg = self.backend, self.config
        h = self.mixer(norm(be, cfg, x, self.attn_norm), p, shared)
        x = be.add(x, norm(be, cfg, h, self.post_attn_norm))
        x = be.add(x, norm(be, cfg, self.feed_forward(x, p), self.post_ffw_norm))
        if extra is not None:
            gated = be.gated_activation(self.gate(x), extra, cfg.activation)  # (T, P)
            x = be.add(x, norm(be, cfg, self.proj(gated), self.input_norm))
        return x if self.scalar == 1.0 else be.scale(x, self.scalar)


class Model(Transformer):
    """A Gemma 4 model (text)."""

    family = Family(
        activation="gelu_tanh",
        scale_embeddings=True,
        sliding_window_pattern=6,  # the file's per-layer flags decide; this makes the window required
    )
    layer_class = Gemma4Layer
    config: Gemma4Config
    layers: list[Gemma4Layer]  # type: ignore[assignment]

    @classmethod
    def read_config(cls, f: GGUFFile) -> Gemma4Config:
        """The shared config (read where the per-layer keys give their first layer's value),
        then the per-layer settings. Raises ModelFileError."""
        n_layers = f.arch_key("block_count")
        kv_heads = _per_layer_ints(f, "attention.head_count_kv", n_layers)
        ffn = _per_layer_ints(f, "feed_forward_length", n_layers)
        shared = copy.copy(f)  # the same file, the per-layer lists read as one number for the shared fields
        shared.metadata = {
            **f.metadata,
            f"{f.architecture}.attention.head_count_kv": kv_heads[0],
            f"{f.architecture}.feed_forward_length": ffn[0],
        }
        base = ModelConfig.from_gguf(shared, cls.family)
        sliding = f.arch_key("attention.sliding_window_pattern")
        if not isinstance(sliding, list) or len(sliding) != n_layers or not all(isinstance(s, bool) for s in sliding):
            bad_file(f, f"{f.architecture}.attention.sliding_window_pattern should be one true/false per layer")
        head_local = f.arch_key("attention.key_length_swa")
        if not isinstance(head_local, int) or head_local <= 0 or f.arch_key("attention.value_length_swa") != head_local:
            bad_file(f, "the sliding-window layers' key and value sizes should be one positive whole number")
        if base.value_head_dim != base.head_dim:
            bad_file(f, "the global layers' key and value sizes should be equal")
        rope_local = f.arch_key("rope.dimension_count_swa", head_local)
        shared_layers = f.arch_key("attention.shared_kv_layers", 0)
        per_layer_input = f.arch_key("embedding_length_per_layer_input", 0)
        for key, value in (("shared_kv_layers", shared_layers), ("embedding_length_per_layer_input", per_layer_input)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                bad_file(f, f"{f.architecture}.{key} should be a whole number, not {str(value)[:40]}")
        config = Gemma4Config(
            **vars(base),
            sliding=tuple(sliding),
            kv_heads=kv_heads,
            ffn=ffn,
            head_dim_local=head_local,
            rope_dim_local=rope_local,
            shared_kv_layers=shared_layers,
            per_layer_input=per_layer_input,
        )
        config = replace(config, rope_base_local=float(f.arch_key("rope.freq_base_swa", config.rope_base)))
        for i in range(n_layers):
            if (
                config.n_heads % kv_heads[i]
                or not 0 < config.layer_config(i).rope_dim <= config.layer_config(i).head_dim
            ):
                bad_file(f, f"layer {i}'s heads, key/value heads and RoPE width do not fit together")
        first_shared = n_layers - shared_layers
        if shared_layers and any(s not in sliding[:first_shared] for s in sliding[first_shared:]):
            bad_file(f, "a layer reuses the keys and values of a kind of layer that no earlier layer computes")
        return config

    @classmethod
    def layer_blocks(cls, config: ModelConfig, i: int) -> tuple[type[Any], type[Any]]:
        """Attention (its own keys and values, or a source layer's), and the MLP, with a
        mixture of experts beside it in a MoE file."""
        assert isinstance(config, Gemma4Config)
        mixer = Gemma4Attention if config.kv_source(i) == i else SharedKVAttention
        return mixer, Gemma4MoE if config.n_experts else Gemma4MLP

    @classmethod
    def check_tensors(cls, f: GGUFFile, config: ModelConfig) -> None:
        """Each layer's tensors at its own shapes, the global layers' RoPE divisors and the
        per-layer inputs' tensors where the file has them; ModelFileError naming the first
        that is missing or misshaped."""
        assert isinstance(config, Gemma4Config)

        def blocks(i: int) -> tuple[type[Block], ...]:
            return (cls.layer_class, *cls.layer_blocks(config, i))

        required = PER_LAYER_INPUT if config.per_layer_input else ()
        check_layer_tensors(f, config, blocks, required, config.layer_config)
        if not all(config.sliding):
            freqs = required_tensor(f, "rope_freqs.weight")
            if freqs.shape != (config.head_dim // 2,):
                bad_file(f, f"rope_freqs.weight has shape {freqs.shape}, expected ({config.head_dim // 2},)")
        for i in range(config.n_layers if config.n_experts else 0):
            if f"blk.{i}.ffn_gate_exps.weight" not in f.tensors:
                required_tensor(f, f"blk.{i}.ffn_gate_up_exps.weight")
        if config.per_layer_input:
            width = config.n_layers * config.per_layer_input
            for name, shape in (
                ("per_layer_token_embd.weight", (config.vocab_size, width)),
                ("per_layer_model_proj.weight", (width, config.d_model)),
                ("per_layer_proj_norm.weight", (config.per_layer_input,)),
            ):
                if required_tensor(f, name).shape != shape:
                    bad_file(
                        f, f"the tensor {name!r} has shape {f.tensors[name].shape}, but the metadata implies {shape}"
                    )

    def read_globals(self, reader: LayerReader) -> None:
        """The per-layer input embedding, its projection and norm, where the file has them."""
        self.per_layer_embd = reader.optional_weight("per_layer_token_embd.weight")
        self.per_layer_proj = reader.optional_weight("per_layer_model_proj.weight")
        self.per_layer_norm = reader.optional_weight("per_layer_proj_norm.weight")

    @property
    def load_notes(self) -> list[str]:
        """A note where the file also holds a vision or audio tower (llama.cpp's names for them
        start with "v.", "a." or "mm."), which Sprig leaves unread."""
        towers = [name for name in self._file.tensors if name.startswith(TOWERS)]
        if not towers:
            return []
        return [
            f"This file also holds Gemma 4's image or audio encoder ({len(towers)} tensors); "
            "Sprig reads the text model only, so the model answers text and leaves those tensors unread."
        ]

    def layer_attention(self, i: int) -> LayerAttention:
        """Unscaled queries (their norm sets their size), the window on sliding layers, no soft-cap."""
        return LayerAttention(1.0, self.config.sliding_window if self.config.sliding[i] else None)

    def layer_rope(self, i: int) -> LayerRope:
        """The local base on sliding layers; the global base with the file's proportional
        divisors on global ones."""
        if self.config.sliding[i]:
            return LayerRope(self.config.rope_base_local)
        return LayerRope(self.config.rope_base, self._file.tensors["rope_freqs.weight"].data.view("<f4"))

    def per_layer_inputs(self, x: Any, p: PassInput) -> list[Any]:
        """Each layer's input (T, P) from the tokens and their scaled embedding `x` (T, D):
        (norm(proj(x) / sqrt(D)) + embd(token) * sqrt(P)) / sqrt(2), cut per layer."""
        be, cfg = self.backend, self.config
        n, width = len(p.positions), cfg.per_layer_input
        tokens = be.embedding(self.per_layer_embd, p.tokens, math.sqrt(width))  # (T, L * P)
        projected = be.scale(be.linear(x, self.per_layer_proj), 1.0 / math.sqrt(cfg.d_model))  # (T, L * P)
        projected = norm(be, cfg, projected.reshape(n, cfg.n_layers, width), self.per_layer_norm)  # (T, L, P)
        both = be.scale(be.add(projected.reshape(n, cfg.n_layers * width), tokens), 1.0 / math.sqrt(2.0))  # (T, L * P)
        return [be.columns(both, i * width, width) for i in range(cfg.n_layers)]  # L of (T, P)

    def logits(self, p: PassInput) -> Any:
        """As `Transformer.logits`, with each layer's per-layer input, and each kind's keys and
        values of this pass kept for the KV-sharing layers."""
        cfg = self.config
        x = self.embed(p)  # (T, D)
        extras = self.per_layer_inputs(x, p) if cfg.per_layer_input else [None] * cfg.n_layers
        shared: dict[str, tuple[Any, Any]] = {}
        for layer, extra in zip(self.layers, extras, strict=True):
            x = layer(x, p, shared, extra)
        return self.head(x, p)
