"""The hyperparameters of a model, read from its GGUF metadata.

Each architecture's file in `engine/models/` says how it differs from the shared layout,
as a `Family`; `ModelConfig.from_gguf` reads a file's hyperparameters with its family's
settings. The per-layer tensors are checked against the tables of the blocks that read
them (`engine.models.block`).

Gemma's RMS norm multiplies by (1 + w). llama.cpp's converter stores w + 1 in the GGUF
file and llama.cpp multiplies by the stored weight as it is; transformers, loading a
Gemma GGUF, subtracts the 1 again (its Gemma2TensorProcessor, used for gemma3 too). The
values in the bundled Gemma-3-270M cannot settle it alone (output_norm.weight spans
0.19..301, mean 26), so Sprig follows those two readers: every architecture multiplies
by the stored norm weight, and there is no offset to apply.
"""

import math
from dataclasses import dataclass
from typing import NoReturn

from engine.errors import ModelFileError
from engine.gguf_file import GGUFFile, TensorInfo


@dataclass(frozen=True)
class Family:
    """What one architecture adds to the shared layout; its file in engine/models/ holds it.

    The per-layer tensors a family lists must be in every file of that architecture; the
    model loads any optional tensor of its blocks that a file has.
    """

    layer_tensors: tuple[str, ...] = ()  # optional tensors of its blocks that it requires
    activation: str = "silu"  # or "gelu_tanh", or "swiglu_oai" (gpt-oss)
    expert_routing: str = "softmax_top_k"  # how a MoE layer weighs its experts (backends.base.Routing)
    norm: str = "rms"  # or "layer": LayerNorm (Command-R, StarCoder2), its epsilon under its own key
    qk_norm_whole: bool = False  # q/k norms over the whole projection (OLMo 2), not per head
    logit_scale_divides: bool = False  # the file's logit_scale divides the logits (Granite), not multiplies
    no_rope_every: int = 0  # every n-th layer uses no RoPE (SmolLM3: 4)
    rope_on_sliding_only: bool = False  # only sliding-window layers rotate (Command R7B's global layers: none)
    # llama.cpp's converter permutes the rows of llama's q/k weights so that RoPE rotates
    # adjacent pairs (x0, x1), (x2, x3)... ("normal" mode). Qwen and Gemma files keep
    # Hugging Face's order, where RoPE rotates x[i] with x[i + rope_dim/2] ("NEOX" mode).
    rope_neox: bool = True
    scale_embeddings: bool = False  # multiply embeddings by sqrt(d_model), as Gemma does
    sliding_window_pattern: int = 0  # every n-th layer is global; the others use the window
    all_layers_slide: bool = False  # every layer uses the window, where the file sets one (Phi-3)
    rope_base_local: float | None = None  # RoPE base of the sliding-window layers, if it differs
    attn_logit_softcap: float | None = None  # the default where the file has no value
    final_logit_softcap: float | None = None
    # The 27B Gemmas scale queries by 1/sqrt(d_model / n_heads) instead of 1/sqrt(head_dim)
    # (query_pre_attn_scalar in their Hugging Face configs). llama.cpp tells them by layer count.
    d_model_query_scale_layers: int | None = None


@dataclass(frozen=True)
class ModelConfig:
    """Everything the forward pass needs to know about a model's shape and features."""

    architecture: str
    n_layers: int
    d_model: int
    n_heads: int
    n_kv_heads: int
    head_dim: int  # of queries and keys
    value_head_dim: int
    d_ff: int
    vocab_size: int  # rows of token_embd.weight, whatever the metadata says
    context_length: int
    norm_eps: float  # of the RMS norms, or of the LayerNorms (`norm`)
    norm: str  # "rms" or "layer"
    qk_norm_whole: bool
    logit_scale: float  # what the logits are multiplied by (1: nothing)
    residual_scale: float  # what each block's output is multiplied by before the residual add
    rope_base: float  # of global layers, for Gemma 3
    rope_base_local: float  # of sliding-window layers; equal to rope_base where no such split
    rope_dim: int  # leading dimensions of each head that RoPE rotates
    rope_neox: bool  # True: rotate halves (x[i], x[i + rope_dim/2]); False: adjacent pairs
    rope_scaling_type: str | None  # e.g. "linear"; for Gemma 3 it applies to global layers only
    rope_scaling_factor: float | None
    attn_scale: float  # multiplies q.k before the softmax
    tie_embeddings: bool  # no output.weight: the output projection is token_embd.weight
    sliding_window: int | None
    sliding_window_pattern: int  # every n-th layer is global; 0: with a window, none is
    attn_logit_softcap: float | None
    final_logit_softcap: float | None
    embedding_scale: float
    activation: str  # "silu", "gelu_tanh" or "swiglu_oai"
    rope_original_context: int  # the context the model was trained at before RoPE scaling (YaRN, LongRoPE)
    rope_attn_factor: float  # what LongRoPE scales queries and keys by (1: nothing)
    yarn_beta_fast: float  # YaRN's ramp: frequencies rotating more than this often are kept
    yarn_beta_slow: float  # ...and less than this often, interpolated
    n_experts: int = 0  # experts per MoE layer (0: a dense model)
    n_experts_used: int = 0  # experts each token goes through
    no_rope_every: int = 0
    rope_on_sliding_only: bool = False
    d_expert: int = 0  # an expert's feed-forward width
    expert_routing: str = "softmax_top_k"
    expert_weights_norm: bool = True  # divide the chosen experts' weights by their sum
    d_shared_expert: int = 0  # the shared expert's feed-forward width (0: none)
    unused_layers: int = 0  # layers the file has past `n_layers` that are not run (multi-token prediction)
    recurrent_layers: tuple[bool, ...] = ()  # which layers are Gated DeltaNet layers (Qwen3.5); () none
    conv_kernel: int = 0  # the DeltaNet layers' short convolution: its width
    delta_k_heads: int = 0  # their key (and query) heads
    delta_v_heads: int = 0  # their value heads, a multiple of the key heads
    delta_head_dim: int = 0  # the width of every key and value head

    def is_sliding(self, layer: int) -> bool:
        """Whether `layer` attends within the sliding window (Gemma 3: all but every 6th layer)."""
        if self.sliding_window is None:
            return False
        pattern = self.sliding_window_pattern
        return pattern == 0 or (layer + 1) % pattern != 0

    def uses_rope(self, layer: int) -> bool:
        """Whether `layer` rotates its queries and keys (SmolLM3's every 4th layer and Command
        R7B's global layers do not)."""
        if self.no_rope_every and (layer + 1) % self.no_rope_every == 0:
            return False
        return not self.rope_on_sliding_only or self.is_sliding(layer)

    def layer_rope_base(self, layer: int) -> float:
        """The RoPE base of `layer`: Gemma 3's local layers use their own."""
        return self.rope_base_local if self.is_sliding(layer) else self.rope_base

    @classmethod
    def from_gguf(cls, f: GGUFFile, family: Family) -> "ModelConfig":
        """Read the config of `f`, an architecture of `family`, and check every required tensor and its shape.

        Raises ModelFileError for a missing or inconsistent key or tensor.
        (`engine.models.read_config` finds the family of a file.)
        """
        d_model = _positive_int(f, "embedding_length")
        n_heads = _positive_int(f, "attention.head_count")
        n_kv_heads = _positive_int(f, "attention.head_count_kv", n_heads)
        if n_heads % n_kv_heads:
            bad_file(f, f"{n_heads} attention heads cannot share {n_kv_heads} key/value heads evenly")
        if f.arch_key("attention.key_length", None) is None and d_model % n_heads:
            bad_file(f, f"the embedding size {d_model} is not a whole number of {n_heads} heads")
        head_dim = _positive_int(f, "attention.key_length", d_model // n_heads)
        rope_dim = _positive_int(f, "rope.dimension_count", head_dim)
        if rope_dim > head_dim or rope_dim % 2:
            bad_file(f, f"the RoPE dimension {rope_dim} must be even and at most the head size {head_dim}")
        embedding = required_tensor(f, "token_embd.weight")
        if len(embedding.shape) != 2 or embedding.shape[1] != d_model:
            bad_file(f, f"token_embd.weight has shape {embedding.shape}, expected (vocab, {d_model})")
        unused_layers = f.arch_key("nextn_predict_layers", 0)  # counted in block_count (llama.cpp)
        if isinstance(unused_layers, bool) or not isinstance(unused_layers, int) or unused_layers < 0:
            bad_file(f, f"nextn_predict_layers should be a whole number, not {str(unused_layers)[:40]}")
        n_layers = _positive_int(f, "block_count") - unused_layers
        if n_layers <= 0:
            bad_file(f, f"its {unused_layers} multi-token-prediction layers leave no layer to run")
        rope_base = _positive_float(f, "rope.freq_base", 10000.0)
        query_by_d_model = family.d_model_query_scale_layers == n_layers
        context_length = _positive_int(f, "context_length")
        config = cls(
            architecture=f.architecture,
            n_layers=n_layers,
            d_model=d_model,
            n_heads=n_heads,
            n_kv_heads=n_kv_heads,
            head_dim=head_dim,
            value_head_dim=_positive_int(f, "attention.value_length", head_dim),
            d_ff=_positive_int(f, "feed_forward_length", f.arch_key("expert_feed_forward_length", None)),
            vocab_size=embedding.shape[0],
            context_length=context_length,
            norm_eps=_positive_float(
                f, "attention.layer_norm_epsilon" if family.norm == "layer" else "attention.layer_norm_rms_epsilon"
            ),
            norm=family.norm,
            qk_norm_whole=family.qk_norm_whole,
            logit_scale=_logit_scale(f, family),
            residual_scale=_positive_float(f, "residual_scale", 1.0),
            rope_base=rope_base,
            rope_base_local=family.rope_base_local or rope_base,
            rope_dim=rope_dim,
            rope_neox=family.rope_neox,
            rope_scaling_type=_rope_scaling_type(f),
            rope_scaling_factor=_optional_float(f, "rope.scaling.factor", None),
            attn_scale=_positive_float(
                f, "attention.scale", 1.0 / math.sqrt(d_model / n_heads if query_by_d_model else head_dim)
            ),
            tie_embeddings="output.weight" not in f.tensors,
            sliding_window=_sliding_window(f, family),
            sliding_window_pattern=family.sliding_window_pattern,
            attn_logit_softcap=_optional_float(f, "attn_logit_softcapping", family.attn_logit_softcap),
            final_logit_softcap=_optional_float(f, "final_logit_softcapping", family.final_logit_softcap),
            embedding_scale=_positive_float(
                f, "embedding_scale", math.sqrt(d_model) if family.scale_embeddings else 1.0
            ),
            activation=family.activation,
            rope_original_context=_positive_int(f, "rope.scaling.original_context_length", context_length),
            rope_attn_factor=_positive_float(f, "rope.scaling.attn_factor", 1.0),
            yarn_beta_fast=_positive_float(f, "rope.scaling.yarn_beta_fast", 32.0),
            yarn_beta_slow=_positive_float(f, "rope.scaling.yarn_beta_slow", 1.0),
            no_rope_every=family.no_rope_every,
            rope_on_sliding_only=family.rope_on_sliding_only,
            **_experts(f, family),
            **_recurrent(f, n_layers),
            unused_layers=unused_layers,
        )
        return config


def bad_file(f: GGUFFile, problem: str) -> NoReturn:
    """Raise ModelFileError: `f` cannot be used because of `problem`."""
    raise ModelFileError(f"Cannot use {f.path}: {problem}. The file is damaged or was converted wrongly.")


def required_tensor(f: GGUFFile, name: str) -> TensorInfo:
    """The tensor `name` of `f`; ModelFileError, naming it, where the file lacks it."""
    if name not in f.tensors:
        raise ModelFileError(
            f"Cannot use {f.path}: the tensor {name!r}, which every {f.architecture} model has, is missing. "
            "The file is incomplete or was converted wrongly."
        )
    return f.tensors[name]


def _positive_int(f: GGUFFile, suffix: str, default: int | None = None) -> int:
    value = f.arch_key(suffix) if default is None else f.arch_key(suffix, default)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        bad_file(f, f"{f.architecture}.{suffix} should be a positive whole number, not {str(value)[:40]}")
    return value


def _positive_float(f: GGUFFile, suffix: str, default: float | None = None) -> float:
    value = f.arch_key(suffix) if default is None else f.arch_key(suffix, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
        bad_file(f, f"{f.architecture}.{suffix} should be a positive number, not {str(value)[:40]}")
    return float(value)


def _optional_float(f: GGUFFile, suffix: str, default: float | None) -> float | None:
    if f.arch_key(suffix, None) is None:
        return default
    return _positive_float(f, suffix)


def _sliding_window(f: GGUFFile, family: Family) -> int | None:
    """The window of the sliding layers: required where the family interleaves them, read
    where every layer may slide (0 or none: no window)."""
    if family.sliding_window_pattern:
        return _positive_int(f, "attention.sliding_window")
    if family.all_layers_slide and f.arch_key("attention.sliding_window", 0):
        return _positive_int(f, "attention.sliding_window")
    return None


def _logit_scale(f: GGUFFile, family: Family) -> float:
    """The factor on the logits: the file's logit_scale (Command-R), or its inverse (Granite)."""
    scale = _positive_float(f, "logit_scale", 1.0)
    return 1.0 / scale if family.logit_scale_divides else scale


def _experts(f: GGUFFile, family: Family) -> dict:
    """The MoE hyperparameters of `f`, or none for a dense model; every count checked."""
    if f.arch_key("expert_count", None) is None:
        return {}
    n_experts = _positive_int(f, "expert_count")
    used = _positive_int(f, "expert_used_count")
    if used > n_experts:
        bad_file(f, f"each token would use {used} of only {n_experts} experts")
    norm = f.arch_key("expert_weights_norm", True)
    if not isinstance(norm, bool):
        bad_file(f, f"{f.architecture}.expert_weights_norm should be true or false, not {str(norm)[:40]}")
    return {
        "n_experts": n_experts,
        "n_experts_used": used,
        "d_expert": _positive_int(f, "expert_feed_forward_length", f.arch_key("feed_forward_length", None)),
        "expert_routing": family.expert_routing,
        "expert_weights_norm": norm,
        "d_shared_expert": f.arch_key("expert_shared_feed_forward_length", 0),
    }


def _recurrent(f: GGUFFile, n_layers: int) -> dict:
    """The Gated DeltaNet hyperparameters of a hybrid file (llama.cpp's `ssm.*` keys), or none:
    which layers are recurrent (`attention.recurrent_layers`, else every layer but each
    `full_attention_interval`-th), the convolution's width, the heads and their width."""
    if f.arch_key("ssm.conv_kernel", None) is None:
        return {}
    recurrent = f.arch_key("attention.recurrent_layers", None)
    if recurrent is None:
        interval = _positive_int(f, "full_attention_interval", 4)
        recurrent = [(i + 1) % interval != 0 for i in range(n_layers)]
    if len(recurrent) < n_layers:
        bad_file(f, f"attention.recurrent_layers names {len(recurrent)} layers of {n_layers}")
    k_heads, v_heads = _positive_int(f, "ssm.group_count"), _positive_int(f, "ssm.time_step_rank")
    head_dim = _positive_int(f, "ssm.state_size")
    if v_heads % k_heads or _positive_int(f, "ssm.inner_size") != v_heads * head_dim:
        bad_file(f, f"{v_heads} value heads of {head_dim} cannot share {k_heads} key heads as ssm.inner_size says")
    return {
        "recurrent_layers": tuple(bool(r) for r in recurrent[:n_layers]),
        "conv_kernel": _positive_int(f, "ssm.conv_kernel"),
        "delta_k_heads": k_heads,
        "delta_v_heads": v_heads,
        "delta_head_dim": head_dim,
    }


def _rope_scaling_type(f: GGUFFile) -> str | None:
    value = f.arch_key("rope.scaling.type", "none")
    if not isinstance(value, str):
        bad_file(f, f"{f.architecture}.rope.scaling.type should be a name such as 'linear', not {str(value)[:40]}")
    return None if value == "none" else value
