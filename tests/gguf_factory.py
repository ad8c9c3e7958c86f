"""Tiny synthetic GGUF models for tests, written with gguf-py's GGUFWriter.

`write_tiny_model` writes a complete model file of a supported architecture with random
weights: every tensor llama.cpp expects, the hyperparameters under llama.cpp's key names,
and a small byte-level BPE vocabulary ("gpt2" tokenizer) with ChatML special tokens.
"""

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType, GGUFValueType, GGUFWriter, TokenType, quants

F32 = GGMLQuantizationType.F32
MERGES = ("t h", "h e", "i n", "Ġ t", "th e")
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
HARMONY_TOKENS = ("<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|return|>", "<|call|>", "<|constrain|>")
CHATML_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

_ROPE_BASE = {"llama": 10000.0, "qwen2": 1000000.0, "qwen3": 1000000.0, "gemma2": 10000.0, "gemma3": 1000000.0,
              "qwen3moe": 1000000.0, "gpt-oss": 150000.0}
_ATTENTION = ("attn_norm.weight", "attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight")
_DENSE = ("ffn_norm.weight", "ffn_gate.weight", "ffn_up.weight", "ffn_down.weight")
_EXPERTS = ("ffn_gate_inp.weight", "ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight")
_LAYER_TENSORS = {
    "llama": _ATTENTION + _DENSE,
    "qwen2": _ATTENTION + _DENSE + ("attn_q.bias", "attn_k.bias", "attn_v.bias"),
    "qwen3": _ATTENTION + _DENSE + ("attn_q_norm.weight", "attn_k_norm.weight"),
    "gemma2": _ATTENTION + _DENSE + ("post_attention_norm.weight", "post_ffw_norm.weight"),
    "gemma3": _ATTENTION + _DENSE
    + ("post_attention_norm.weight", "post_ffw_norm.weight", "attn_q_norm.weight", "attn_k_norm.weight"),
    "qwen3moe": _ATTENTION + ("ffn_norm.weight",) + _EXPERTS + ("attn_q_norm.weight", "attn_k_norm.weight"),
    "gpt-oss": _ATTENTION + ("post_attention_norm.weight",) + _EXPERTS
    + ("attn_q.bias", "attn_k.bias", "attn_v.bias", "attn_output.bias", "attn_sinks.weight", "ffn_gate_inp.bias",
       "ffn_gate_exps.bias", "ffn_up_exps.bias", "ffn_down_exps.bias"),
}
N_EXPERTS, N_EXPERTS_USED = 4, 2  # of the tiny MoE models


def byte_symbols() -> list[str]:
    """The 256 symbols of a byte-level BPE alphabet, indexed by byte value.

    Printable Latin-1 bytes stand for themselves; the rest (controls, space, 0x7F-0xA0,
    0xAD) are shifted to code points 256 and up, in byte order, so that every byte has a
    visible symbol (space becomes "Ġ").
    """
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    shifted = iter(range(256, 512))
    return [chr(b) if b in printable else chr(next(shifted)) for b in range(256)]


def tiny_vocab(vocab: int, specials: tuple[str, ...] = SPECIAL_TOKENS) -> tuple[list[str], list[int]]:
    """Tokens and token types: 256 byte symbols, the merged tokens, specials, then reserved slots."""
    tokens = byte_symbols() + [m.replace(" ", "") for m in MERGES] + list(specials)
    if vocab < len(tokens):
        raise ValueError(f"vocab must be at least {len(tokens)} to hold the bytes, merges and special tokens")
    types = [TokenType.NORMAL] * (256 + len(MERGES)) + [TokenType.CONTROL] * len(specials)
    n_reserved = vocab - len(tokens)
    tokens += [f"<|reserved_{i}|>" for i in range(n_reserved)]
    types += [TokenType.USER_DEFINED] * n_reserved
    return tokens, [int(t) for t in types]


def _value_type(value: Any) -> GGUFValueType:
    """The GGUF type a converter would use: uint32 for counts, like llama.cpp's converter."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**32:
        return GGUFValueType.UINT32
    return GGUFValueType.get_type(value)


def _weight(rng: np.random.Generator, shape: tuple[int, ...], kind: str) -> np.ndarray:
    if kind == "norm":
        return (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
    if kind == "bias":
        return (0.1 * rng.standard_normal(shape)).astype(np.float32)
    if kind == "router":  # large enough that tokens choose different experts, clearly
        return (3.0 * rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32)
    return (rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32)  # (n_out, n_in)


def model_metadata(arch: str, n_layers: int, d_model: int, n_heads: int, n_kv_heads: int, head_dim: int,
                   d_ff: int, vocab: int, context_length: int = 256) -> dict[str, Any]:
    """The GGUF metadata of a model of these shapes, under llama.cpp's key names, with the
    tiny byte-level BPE vocabulary (padded with reserved tokens to `vocab`) and ChatML."""
    tokens, token_types = tiny_vocab(vocab, SPECIAL_TOKENS + HARMONY_TOKENS if arch == "gpt-oss" else SPECIAL_TOKENS)
    return {
        "general.name": f"tiny-{arch}",
        f"{arch}.block_count": n_layers,
        f"{arch}.context_length": context_length,
        f"{arch}.embedding_length": d_model,
        f"{arch}.feed_forward_length": d_ff,
        f"{arch}.attention.head_count": n_heads,
        f"{arch}.attention.head_count_kv": n_kv_heads,
        f"{arch}.attention.key_length": head_dim,
        f"{arch}.attention.value_length": head_dim,
        f"{arch}.attention.layer_norm_rms_epsilon": 1e-6,
        f"{arch}.rope.freq_base": _ROPE_BASE[arch],
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "default",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": token_types,
        "tokenizer.ggml.merges": list(MERGES),
        "tokenizer.ggml.bos_token_id": tokens.index("<|endoftext|>"),
        "tokenizer.ggml.eos_token_id": tokens.index("<|return|>" if arch == "gpt-oss" else "<|im_end|>"),
        "tokenizer.ggml.add_bos_token": False,
        "tokenizer.chat_template": CHATML_TEMPLATE,
    }


def write_tiny_model(
    path: str | Path,
    arch: str = "qwen3",
    n_layers: int = 2,
    d_model: int = 64,
    n_heads: int = 4,
    n_kv_heads: int = 2,
    head_dim: int = 16,
    d_ff: int = 128,
    vocab: int = 288,
    tensor_type: GGMLQuantizationType = F32,
    seed: int = 0,
    tie_embeddings: bool | None = None,
    omit_tensors: tuple[str, ...] = (),
    extra_tensors: dict[str, tuple[int, ...]] | None = None,
    tensor_values: dict[str, np.ndarray] | None = None,
    split_max_tensors: int = 0,
    quantize: Callable[[np.ndarray, GGMLQuantizationType], np.ndarray] = quants.quantize,
    **extra_metadata: Any,
) -> Path:
    """Write a tiny `arch` model with random weights to `path` and return the path.

    Matrices (embeddings, projections) are stored as `tensor_type`, turned into blocks by
    `quantize(values, tensor_type)` (gguf-py's by default; pass your own for Q1_0, which
    gguf-py cannot quantize); norms and biases stay F32, as llama.cpp stores them. `extra_metadata`
    adds or overrides keys (pass them as `**{"qwen3.vocab_size": 1000}`); a value of
    None removes the key. `omit_tensors` leaves the named tensors out; `extra_tensors` adds
F32 tensors of the given names and shapes (an optional tensor, or a misshaped one), random
unless `tensor_values` gives their values;
`split_max_tensors` splits the file as llama.cpp's gguf-split does, into parts named
`{stem}-0000k-of-0000N.gguf` of at most that many tensors (`path` then names none of them). `tie_embeddings`
    (no output.weight) defaults to what llama.cpp expects: tied for the Gemmas (it
    refuses a gemma2 file with output.weight), untied otherwise.
    """
    path = Path(path)
    rng = np.random.default_rng(seed)
    metadata = model_metadata(arch, n_layers, d_model, n_heads, n_kv_heads, head_dim, d_ff, vocab)
    if arch.startswith("gemma") or arch == "gpt-oss":
        metadata[f"{arch}.attention.sliding_window"] = 16
    if arch in ("qwen3moe", "gpt-oss"):
        metadata.update({f"{arch}.expert_count": N_EXPERTS, f"{arch}.expert_used_count": N_EXPERTS_USED,
                         f"{arch}.expert_feed_forward_length": d_ff})
    metadata.update(extra_metadata)
    experts = N_EXPERTS

    q, kv = n_heads * head_dim, n_kv_heads * head_dim
    shapes = {  # (n_out, n_in) for matrices
        "attn_norm.weight": ((d_model,), "norm"),
        "attn_q.weight": ((q, d_model), "matrix"),
        "attn_k.weight": ((kv, d_model), "matrix"),
        "attn_v.weight": ((kv, d_model), "matrix"),
        "attn_output.weight": ((d_model, q), "matrix"),
        "ffn_norm.weight": ((d_model,), "norm"),
        "ffn_gate.weight": ((d_ff, d_model), "matrix"),
        "ffn_up.weight": ((d_ff, d_model), "matrix"),
        "ffn_down.weight": ((d_model, d_ff), "matrix"),
        "attn_q.bias": ((q,), "bias"),
        "attn_k.bias": ((kv,), "bias"),
        "attn_v.bias": ((kv,), "bias"),
        "attn_q_norm.weight": ((head_dim,), "norm"),
        "attn_k_norm.weight": ((head_dim,), "norm"),
        "post_attention_norm.weight": ((d_model,), "norm"),
        "post_ffw_norm.weight": ((d_model,), "norm"),
        "attn_output.bias": ((d_model,), "bias"),
        "attn_sinks.weight": ((n_heads,), "bias"),
        "ffn_gate_inp.weight": ((experts, d_model), "router"),
        "ffn_gate_inp.bias": ((experts,), "bias"),
        "ffn_gate_exps.weight": ((experts, d_ff, d_model), "matrix"),
        "ffn_up_exps.weight": ((experts, d_ff, d_model), "matrix"),
        "ffn_down_exps.weight": ((experts, d_model, d_ff), "matrix"),
        "ffn_gate_exps.bias": ((experts, d_ff), "bias"),
        "ffn_up_exps.bias": ((experts, d_ff), "bias"),
        "ffn_down_exps.bias": ((experts, d_model), "bias"),
    }
    layer_tensors = _LAYER_TENSORS[arch]
    tensors = {"token_embd.weight": ((vocab, d_model), "matrix")}
    for layer in range(n_layers):
        tensors.update({f"blk.{layer}.{name}": shapes[name] for name in layer_tensors})
    tensors["output_norm.weight"] = ((d_model,), "norm")
    if tie_embeddings is None:
        tie_embeddings = arch.startswith("gemma")
    if not tie_embeddings:
        tensors["output.weight"] = ((vocab, d_model), "matrix")
    tensors.update({name: (shape, "bias") for name, shape in (extra_tensors or {}).items()})

    writer = GGUFWriter(path, arch, split_max_tensors=split_max_tensors)
    for key, value in metadata.items():
        if value is None:
            writer.kv_data[0].pop(key, None)
        else:
            writer.add_key_value(key, value, _value_type(value))
    for name, (shape, kind) in tensors.items():
        if name in omit_tensors:
            continue
        values = _weight(rng, shape, kind)
        if name in (tensor_values or {}):
            values = np.asarray(tensor_values[name], dtype=np.float32).reshape(shape)
        if kind == "matrix" and tensor_type != F32:
            writer.add_tensor(name, quantize(values, tensor_type), raw_dtype=tensor_type)
        else:
            writer.add_tensor(name, values)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def write_mamba_model(path: str | Path) -> Path:
    """A well-formed GGUF file of an architecture Sprig does not run (mamba)."""
    writer = GGUFWriter(path, "mamba")
    writer.add_uint32("mamba.block_count", 1)
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return Path(path)
