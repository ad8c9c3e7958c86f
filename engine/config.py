"""The hyperparameters of a model, read from its GGUF metadata and checked against its tensors.

Supported architectures are decoder-only transformers that share one layer layout (RMS
norm, attention with grouped K/V heads and rotary positions, gated MLP). Each one's file
in `engine/models/` says how it differs, as a `Family`; `ModelConfig.from_gguf` reads a
file's hyperparameters with its family's settings. `LAYER_TENSORS` is the one table of the
per-layer GGUF tensors: their names, their fields in the model, their shapes.

Gemma's RMS norm multiplies by (1 + w). llama.cpp's converter stores w + 1 in the GGUF
file and llama.cpp multiplies by the stored weight as it is; transformers, loading a
Gemma GGUF, subtracts the 1 again (its Gemma2TensorProcessor, used for gemma3 too). The
values in the bundled Gemma-3-270M cannot settle it alone (output_norm.weight spans
0.19..301, mean 26), so Sprig follows those two readers: every architecture multiplies
by the stored norm weight, and there is no offset to apply.
"""

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import NoReturn

from engine.errors import ModelFileError
from engine.gguf_file import GGUFFile, TensorInfo


@dataclass(frozen=True)
class LayerTensor:
    """One per-layer GGUF tensor: its name after `blk.{i}.`, its field in the model, its shape."""

    suffix: str
    field: str  # of engine.models.common.LayerWeights
    shape: Callable[["ModelConfig"], tuple[int, ...]]  # (n_out, n_in) for matrices


LAYER_TENSORS = {
    t.suffix: t
    for t in (
        LayerTensor("attn_norm.weight", "attn_norm", lambda c: (c.d_model,)),
        LayerTensor("attn_q.weight", "wq", lambda c: (c.n_heads * c.head_dim, c.d_model)),
        LayerTensor("attn_k.weight", "wk", lambda c: (c.n_kv_heads * c.head_dim, c.d_model)),
        LayerTensor("attn_v.weight", "wv", lambda c: (c.n_kv_heads * c.value_head_dim, c.d_model)),
        LayerTensor("attn_output.weight", "wo", lambda c: (c.d_model, c.n_heads * c.value_head_dim)),
        LayerTensor("ffn_norm.weight", "ffn_norm", lambda c: (c.d_model,)),
        LayerTensor("ffn_gate.weight", "w_gate", lambda c: (c.d_ff, c.d_model)),
        LayerTensor("ffn_up.weight", "w_up", lambda c: (c.d_ff, c.d_model)),
        LayerTensor("ffn_down.weight", "w_down", lambda c: (c.d_model, c.d_ff)),
        LayerTensor("attn_q.bias", "bq", lambda c: (c.n_heads * c.head_dim,)),
        LayerTensor("attn_k.bias", "bk", lambda c: (c.n_kv_heads * c.head_dim,)),
        LayerTensor("attn_v.bias", "bv", lambda c: (c.n_kv_heads * c.value_head_dim,)),
        LayerTensor("attn_q_norm.weight", "q_norm", lambda c: (c.head_dim,)),
        LayerTensor("attn_k_norm.weight", "k_norm", lambda c: (c.head_dim,)),
        LayerTensor("post_attention_norm.weight", "post_attn_norm", lambda c: (c.d_model,)),
        LayerTensor("post_ffw_norm.weight", "post_ffw_norm", lambda c: (c.d_model,)),
    )
}
# Every architecture has the first nine (norms, attention, MLP); a family names the
# optional ones it needs too.
BASE_LAYER_TENSORS = tuple(LAYER_TENSORS)[:9]
QKV_BIAS = ("attn_q.bias", "attn_k.bias", "attn_v.bias")
QK_NORM = ("attn_q_norm.weight", "attn_k_norm.weight")
POST_NORMS = ("post_attention_norm.weight", "post_ffw_norm.weight")


@dataclass(frozen=True)
class Family:
    """What one architecture adds to the shared layout; its file in engine/models/ holds it.

    The per-layer tensors a family lists must be in every file of that architecture; the
    model loads any tensor of `LAYER_TENSORS` that a file has.
    """

    layer_tensors: tuple[str, ...] = ()  # beyond BASE_LAYER_TENSORS
    activation: str = "silu"  # or "gelu_tanh"
    # llama.cpp's converter permutes the rows of llama's q/k weights so that RoPE rotates
    # adjacent pairs (x0, x1), (x2, x3)... ("normal" mode). Qwen and Gemma files keep
    # Hugging Face's order, where RoPE rotates x[i] with x[i + rope_dim/2] ("NEOX" mode).
    rope_neox: bool = True
    scale_embeddings: bool = False  # multiply embeddings by sqrt(d_model), as Gemma does
    sliding_window_pattern: int = 0  # every n-th layer is global; the others use the window
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
    rms_eps: float
    rope_base: float  # of global layers, for Gemma 3
    rope_base_local: float  # of sliding-window layers; equal to rope_base where no such split
    rope_dim: int  # leading dimensions of each head that RoPE rotates
    rope_neox: bool  # True: rotate halves (x[i], x[i + rope_dim/2]); False: adjacent pairs
    rope_scaling_type: str | None  # e.g. "linear"; for Gemma 3 it applies to global layers only
    rope_scaling_factor: float | None
    attn_scale: float  # multiplies q.k before the softmax
    tie_embeddings: bool  # no output.weight: the output projection is token_embd.weight
    sliding_window: int | None
    sliding_window_pattern: int  # 0: every layer is global
    attn_logit_softcap: float | None
    final_logit_softcap: float | None
    embedding_scale: float
    activation: str  # "silu" or "gelu_tanh"

    def is_sliding(self, layer: int) -> bool:
        """Whether `layer` attends within the sliding window (Gemma 3: all but every 6th layer)."""
        pattern = self.sliding_window_pattern
        return pattern > 0 and (layer + 1) % pattern != 0

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
            _bad(f, f"{n_heads} attention heads cannot share {n_kv_heads} key/value heads evenly")
        if f.arch_key("attention.key_length", None) is None and d_model % n_heads:
            _bad(f, f"the embedding size {d_model} is not a whole number of {n_heads} heads")
        head_dim = _positive_int(f, "attention.key_length", d_model // n_heads)
        rope_dim = _positive_int(f, "rope.dimension_count", head_dim)
        if rope_dim > head_dim or rope_dim % 2:
            _bad(f, f"the RoPE dimension {rope_dim} must be even and at most the head size {head_dim}")
        embedding = _tensor(f, "token_embd.weight")
        if len(embedding.shape) != 2 or embedding.shape[1] != d_model:
            _bad(f, f"token_embd.weight has shape {embedding.shape}, expected (vocab, {d_model})")
        n_layers = _positive_int(f, "block_count")
        rope_base = _positive_float(f, "rope.freq_base", 10000.0)
        query_by_d_model = family.d_model_query_scale_layers == n_layers
        config = cls(
            architecture=f.architecture,
            n_layers=n_layers,
            d_model=d_model,
            n_heads=n_heads,
            n_kv_heads=n_kv_heads,
            head_dim=head_dim,
            value_head_dim=_positive_int(f, "attention.value_length", head_dim),
            d_ff=_positive_int(f, "feed_forward_length"),
            vocab_size=embedding.shape[0],
            context_length=_positive_int(f, "context_length"),
            rms_eps=_positive_float(f, "attention.layer_norm_rms_epsilon"),
            rope_base=rope_base,
            rope_base_local=family.rope_base_local or rope_base,
            rope_dim=rope_dim,
            rope_neox=family.rope_neox,
            rope_scaling_type=_rope_scaling_type(f),
            rope_scaling_factor=_optional_float(f, "rope.scaling.factor", None),
            attn_scale=1.0 / math.sqrt(d_model / n_heads if query_by_d_model else head_dim),
            tie_embeddings="output.weight" not in f.tensors,
            sliding_window=_positive_int(f, "attention.sliding_window") if family.sliding_window_pattern else None,
            sliding_window_pattern=family.sliding_window_pattern,
            attn_logit_softcap=_optional_float(f, "attn_logit_softcapping", family.attn_logit_softcap),
            final_logit_softcap=_optional_float(f, "final_logit_softcapping", family.final_logit_softcap),
            embedding_scale=math.sqrt(d_model) if family.scale_embeddings else 1.0,
            activation=family.activation,
        )
        _check_tensors(f, config, BASE_LAYER_TENSORS + family.layer_tensors)
        return config


def _bad(f: GGUFFile, problem: str) -> NoReturn:
    raise ModelFileError(f"Cannot use {f.path}: {problem}. The file is damaged or was converted wrongly.")


def _tensor(f: GGUFFile, name: str) -> TensorInfo:
    if name not in f.tensors:
        raise ModelFileError(
            f"Cannot use {f.path}: the tensor {name!r}, which every {f.architecture} model has, is missing. "
            "The file is incomplete or was converted wrongly."
        )
    return f.tensors[name]


def _positive_int(f: GGUFFile, suffix: str, default: int | None = None) -> int:
    value = f.arch_key(suffix) if default is None else f.arch_key(suffix, default)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        _bad(f, f"{f.architecture}.{suffix} should be a positive whole number, not {str(value)[:40]}")
    return value


def _positive_float(f: GGUFFile, suffix: str, default: float | None = None) -> float:
    value = f.arch_key(suffix) if default is None else f.arch_key(suffix, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
        _bad(f, f"{f.architecture}.{suffix} should be a positive number, not {str(value)[:40]}")
    return float(value)


def _optional_float(f: GGUFFile, suffix: str, default: float | None) -> float | None:
    if f.arch_key(suffix, None) is None:
        return default
    return _positive_float(f, suffix)


def _rope_scaling_type(f: GGUFFile) -> str | None:
    value = f.arch_key("rope.scaling.type", "none")
    if not isinstance(value, str):
        _bad(f, f"{f.architecture}.rope.scaling.type should be a name such as 'linear', not {str(value)[:40]}")
    return None if value == "none" else value


def _check_tensors(f: GGUFFile, c: ModelConfig, layer_tensors: tuple[str, ...]) -> None:
    """Check that every tensor the architecture needs is present with the shape `c` implies."""
    expected: dict[str, tuple[int, ...]] = {"output_norm.weight": (c.d_model,)}
    if not c.tie_embeddings:
        expected["output.weight"] = (c.vocab_size, c.d_model)
    for name, shape in expected.items():
        _check_shape(f, name, shape)
    for layer in range(c.n_layers):  # stops at the first missing tensor, however large n_layers claims to be
        for suffix in layer_tensors:
            _check_shape(f, f"blk.{layer}.{suffix}", LAYER_TENSORS[suffix].shape(c))


def _check_shape(f: GGUFFile, name: str, shape: tuple[int, ...]) -> None:
    actual = _tensor(f, name).shape
    if actual != shape:
        _bad(f, f"the tensor {name!r} has shape {actual}, but the metadata implies {shape}")
