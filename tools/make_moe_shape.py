"""Write random-weight GGUF files with the layer shapes of real mixture-of-experts models, for benchmarks.

Run from the repository root with a venv that has gguf-py (the reference venv also has
llama-cpp-python, for `--check`):

    /work/refvenv/bin/python -m tools.make_moe_shape --shape qwen3-30b-a3b --out /work/models/qwen3-30b-a3b-shape-q4_k_m.gguf --check
    /work/refvenv/bin/python -m tools.make_moe_shape --shape gpt-oss-20b --out /work/models/gpt-oss-20b-shape-mxfp4.gguf --check
    /work/refvenv/bin/python -m tools.make_moe_shape --shape qwen3.6-35b-a3b --out /work/models/qwen3.6-35b-a3b-shape-q4_k_m.gguf --check

Decode speed depends on shapes and tensor types, not on what the weights say, so these files
time an engine as the real models would, per layer, with fewer layers (numbers, not text):

- "qwen3-30b-a3b" (qwen3moe): hidden 2048, 32 query / 4 KV heads of 128, 128 experts, top 8,
  expert FFN 768, vocabulary 151,936, 12 layers (of 48); llama.cpp's Q4_K_M type choices
  (Q4_K; Q6_K for attn_v and ffn_down_exps on the layers llama.cpp's `use_more_bits` picks,
  and for output.weight; router and norms F32).
- "gpt-oss-20b" (gpt-oss): hidden 2880, 64 query / 8 KV heads of 64, 32 experts, top 4,
  expert FFN 2880, vocabulary 201,088, sliding window 128 on even layers, attention sinks,
  biases, YaRN (factor 32 from 4096), 8 layers (of 24); llama.cpp's MXFP4_MOE type choices
  (experts MXFP4, other matrices Q8_0; router, biases, sinks and norms F32).
- "qwen3.6-35b-a3b" (qwen35moe): hidden 2048, 256 experts, top 8, expert FFN 512 and a shared
  expert of 512 with its gate, vocabulary 248,320; 12 layers (of 40, three groups of the 3:1
  pattern: 9 Gated DeltaNet layers with 16 key / 32 value heads of 128 and a convolution of 4,
  3 gated attention layers with 16 query / 2 KV heads of 256, RoPE on 64 of them); Q4_K_M as
  for Qwen3-30B (Q4_K, Q6_K for attn_v, ffn_down_exps and ffn_down_shexp on the
  `use_more_bits` layers and for output.weight; router, gates' biases, convolutions and norms F32).

As tools/make_bonsai_shape.py does, the quantized blocks are drawn directly (random quant
bits, block scales chosen so that a row's dot product keeps its input's scale) and written
tensor by tensor with gguf-py's GGUFWriter: the float weights behind a 12-layer Qwen3-30B
shape would be 30 GB in F32, and llama_model_quantize on 2 cores would take far longer.
The tokenizer is tests/gguf_factory.py's tiny byte-level BPE padded with reserved tokens.
"""

import argparse
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import GGUFWriter

from tests.gguf_factory import MERGES, _value_type, tiny_vocab

SEED = 0
# bytes per block, weights per block
BLOCK = {T.Q8_0: (34, 32), T.Q4_K: (144, 256), T.Q6_K: (210, 256), T.MXFP4: (17, 32)}


@dataclass(frozen=True)
class MoeShape:
    arch: str
    n_layers: int
    d_model: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    n_expert: int
    n_expert_used: int
    d_ff_exp: int
    vocab: int
    metadata: tuple[tuple[str, Any], ...]  # arch-specific keys, without the "<arch>." prefix
    pre: str
    full_attention_interval: int = 0  # Qwen3.5's hybrid stack: every n-th layer attends, the others are DeltaNets
    d_ff_shared: int = 0  # a shared expert's FFN (0: none)


SHAPES = {
    "qwen3-30b-a3b": MoeShape(
        arch="qwen3moe", n_layers=12, d_model=2048, n_heads=32, n_kv_heads=4, head_dim=128,
        n_expert=128, n_expert_used=8, d_ff_exp=768, vocab=151936, pre="qwen2",
        metadata=(("context_length", 40960), ("feed_forward_length", 6144), ("rope.freq_base", 1000000.0),
                  ("attention.layer_norm_rms_epsilon", 1e-6))),
    "gpt-oss-20b": MoeShape(
        arch="gpt-oss", n_layers=8, d_model=2880, n_heads=64, n_kv_heads=8, head_dim=64,
        n_expert=32, n_expert_used=4, d_ff_exp=2880, vocab=201088, pre="gpt-4o",
        metadata=(("context_length", 131072), ("feed_forward_length", 2880), ("rope.freq_base", 150000.0),
                  ("attention.layer_norm_rms_epsilon", 1e-5), ("attention.sliding_window", 128),
                  ("rope.scaling.type", "yarn"), ("rope.scaling.factor", 32.0),
                  ("rope.scaling.original_context_length", 4096))),
    "qwen3.6-35b-a3b": MoeShape(
        arch="qwen35moe", n_layers=12, d_model=2048, n_heads=16, n_kv_heads=2, head_dim=256,
        n_expert=256, n_expert_used=8, d_ff_exp=512, vocab=248320, pre="qwen35", full_attention_interval=4,
        d_ff_shared=512,
        metadata=(("context_length", 262144), ("rope.freq_base", 10000000.0), ("rope.dimension_count", 64),
                  ("rope.dimension_sections", [11, 11, 10, 0]), ("attention.layer_norm_rms_epsilon", 1e-6),
                  ("expert_shared_feed_forward_length", 512), ("full_attention_interval", 4),
                  ("attention.recurrent_layers", [(i + 1) % 4 != 0 for i in range(12)]),
                  ("ssm.conv_kernel", 4), ("ssm.state_size", 128), ("ssm.group_count", 16),
                  ("ssm.time_step_rank", 32), ("ssm.inner_size", 4096))),
}
DELTA_HEADS, DELTA_K_HEADS, DELTA_DIM, CONV = 32, 16, 128, 4  # qwen3.6-35b-a3b's Gated DeltaNet layers


def use_more_bits(i: int, n: int) -> bool:
    """llama.cpp's choice (llama-quant.cpp) of the layers whose attn_v / ffn_down get more bits."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def tensor_plan(shape: MoeShape) -> list[tuple[str, tuple[int, ...], T]]:
    """(name, NumPy shape (..., n_out, n_in), type) of every tensor, in file order."""
    d, q, kv = shape.d_model, shape.n_heads * shape.head_dim, shape.n_kv_heads * shape.head_dim
    e, ff = shape.n_expert, shape.d_ff_exp
    oss = shape.arch == "gpt-oss"
    plan = [("token_embd.weight", (shape.vocab, d), T.Q8_0 if oss else T.Q4_K)]
    for i in range(shape.n_layers):
        more = use_more_bits(i, shape.n_layers)
        mat = T.Q8_0 if oss else T.Q4_K
        exp = T.MXFP4 if oss else T.Q4_K
        layer = [("attn_norm.weight", (d,), T.F32),
                 ("attn_q.weight", (q, d), mat), ("attn_k.weight", (kv, d), mat),
                 ("attn_v.weight", (kv, d), T.Q6_K if more and not oss else mat),
                 ("attn_output.weight", (d, q), mat)]
        if shape.full_attention_interval:
            layer = hybrid_layer(shape, i, more)
        elif oss:
            layer += [("attn_q.bias", (q,), T.F32), ("attn_k.bias", (kv,), T.F32), ("attn_v.bias", (kv,), T.F32),
                      ("attn_output.bias", (d,), T.F32), ("attn_sinks.weight", (shape.n_heads,), T.F32),
                      ("post_attention_norm.weight", (d,), T.F32),
                      ("ffn_gate_inp.bias", (e,), T.F32), ("ffn_gate_exps.bias", (e, ff), T.F32),
                      ("ffn_up_exps.bias", (e, ff), T.F32), ("ffn_down_exps.bias", (e, d), T.F32)]
        else:
            layer += [("attn_q_norm.weight", (shape.head_dim,), T.F32), ("attn_k_norm.weight", (shape.head_dim,), T.F32),
                      ("ffn_norm.weight", (d,), T.F32)]
        layer += [("ffn_gate_inp.weight", (e, d), T.F32),
                  ("ffn_gate_exps.weight", (e, ff, d), exp), ("ffn_up_exps.weight", (e, ff, d), exp),
                  ("ffn_down_exps.weight", (e, d, ff), T.Q6_K if more and not oss else exp)]
        plan += [(f"blk.{i}.{name}", dims, t) for name, dims, t in layer]
    plan += [("output_norm.weight", (d,), T.F32), ("output.weight", (shape.vocab, d), T.Q8_0 if oss else T.Q6_K)]
    return plan


def hybrid_layer(shape: MoeShape, i: int, more: bool) -> list[tuple[str, tuple[int, ...], T]]:
    """Layer i of a Qwen3.5-MoE shape, before its experts: a Gated DeltaNet, or (every
    `full_attention_interval`-th layer) gated attention; then the shared expert and its gate."""
    d, ff = shape.d_model, shape.d_ff_shared
    if (i + 1) % shape.full_attention_interval:
        conv, v_width = (2 * DELTA_K_HEADS + DELTA_HEADS) * DELTA_DIM, DELTA_HEADS * DELTA_DIM
        layer = [("attn_qkv.weight", (conv, d), T.Q4_K), ("attn_gate.weight", (v_width, d), T.Q4_K),
                 ("ssm_alpha.weight", (DELTA_HEADS, d), T.Q4_K), ("ssm_beta.weight", (DELTA_HEADS, d), T.Q4_K),
                 ("ssm_conv1d.weight", (conv, CONV), T.F32), ("ssm_dt.bias", (DELTA_HEADS,), T.F32),
                 ("ssm_a", (DELTA_HEADS,), T.F32), ("ssm_norm.weight", (DELTA_DIM,), T.F32),
                 ("ssm_out.weight", (d, v_width), T.Q4_K)]
    else:
        q, kv = shape.n_heads * shape.head_dim, shape.n_kv_heads * shape.head_dim
        layer = [("attn_q.weight", (2 * q, d), T.Q4_K), ("attn_k.weight", (kv, d), T.Q4_K),
                 ("attn_v.weight", (kv, d), T.Q6_K if more else T.Q4_K), ("attn_output.weight", (d, q), T.Q4_K),
                 ("attn_q_norm.weight", (shape.head_dim,), T.F32), ("attn_k_norm.weight", (shape.head_dim,), T.F32)]
    return [("attn_norm.weight", (d,), T.F32), *layer, ("post_attention_norm.weight", (d,), T.F32),
            ("ffn_gate_inp_shexp.weight", (1, d), T.F32), ("ffn_gate_shexp.weight", (ff, d), T.Q4_K),
            ("ffn_up_shexp.weight", (ff, d), T.Q4_K), ("ffn_down_shexp.weight", (d, ff), T.Q6_K if more else T.Q4_K)]


def f16_bytes(x: float, n: int) -> np.ndarray:
    """(n, 2) uint8: the fp16 value x, n times."""
    return np.full((n, 1), x, dtype=np.float16).view(np.uint8)


def random_blocks(rng: np.random.Generator, dims: tuple[int, ...], qtype: T) -> np.ndarray:
    """Random blocks of a (..., rows, cols) matrix: (..., rows, cols / block * bytes) uint8.

    Quant bits are uniform random; block scales are set so that |w| is about 1/sqrt(cols)
    (and never NaN or infinite, which random scale bytes could be).
    """
    *lead, cols = dims
    nbytes, nweights = BLOCK[qtype]
    if cols % nweights:
        raise ValueError(f"{qtype.name} needs rows of a multiple of {nweights} weights, not {cols}")
    n_blocks = int(np.prod(lead)) * (cols // nweights)
    blocks = np.frombuffer(rng.bytes(n_blocks * nbytes), dtype=np.uint8).reshape(n_blocks, nbytes).copy()
    target = 1.0 / np.sqrt(cols)
    if qtype == T.Q8_0:  # d, 32 x int8
        blocks[:, 0:2] = f16_bytes(target / 64, n_blocks)
    elif qtype == T.Q4_K:  # d, dmin, 12 bytes of 6-bit scales/mins, 128 bytes of 4-bit quants
        blocks[:, 0:2] = f16_bytes(target / 256, n_blocks)
        blocks[:, 2:4] = f16_bytes(target / 256, n_blocks)
    elif qtype == T.Q6_K:  # 128 ql, 64 qh, 16 int8 scales, d
        blocks[:, 208:210] = f16_bytes(target / 1024, n_blocks)
    elif qtype == T.MXFP4:  # E8M0 exponent, 16 bytes of E2M1 pairs (values up to 6)
        blocks[:, 0] = 127 - int(round(np.log2(6 / target)))
    return blocks.reshape(*lead, (cols // nweights) * nbytes)


def shape_metadata(shape: MoeShape, name: str) -> dict[str, Any]:
    """The GGUF metadata: llama.cpp's key names (as convert_hf_to_gguf writes them) and the tiny vocabulary."""
    tokens, token_types = tiny_vocab(shape.vocab)
    a = shape.arch
    meta = {
        "general.name": name,
        f"{a}.block_count": shape.n_layers,
        f"{a}.embedding_length": shape.d_model,
        f"{a}.attention.head_count": shape.n_heads,
        f"{a}.attention.head_count_kv": shape.n_kv_heads,
        f"{a}.attention.key_length": shape.head_dim,
        f"{a}.attention.value_length": shape.head_dim,
        f"{a}.expert_count": shape.n_expert,
        f"{a}.expert_used_count": shape.n_expert_used,
        f"{a}.expert_feed_forward_length": shape.d_ff_exp,
        **{f"{a}.{k}": v for k, v in shape.metadata},
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": shape.pre,
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": token_types,
        "tokenizer.ggml.merges": list(MERGES),
        "tokenizer.ggml.bos_token_id": tokens.index("<|endoftext|>"),
        "tokenizer.ggml.eos_token_id": tokens.index("<|im_end|>"),
        "tokenizer.ggml.add_bos_token": False,
    }
    return meta


def write_moe_shape(path: str | Path, shape: MoeShape, seed: int = SEED, name: str = "moe-shape") -> Path:
    """Write a random-weight model of `shape`, one tensor at a time (header first), and return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    plan = tensor_plan(shape)
    writer = GGUFWriter(path, shape.arch)
    for key, value in shape_metadata(shape, name).items():
        writer.add_key_value(key, value, _value_type(value))
    for tensor_name, dims, qtype in plan:
        if qtype == T.F32:
            writer.add_tensor_info(tensor_name, dims, np.dtype(np.float32), int(np.prod(dims)) * 4)
        else:
            nbytes, nweights = BLOCK[qtype]
            byte_shape = (*dims[:-1], dims[-1] // nweights * nbytes)
            writer.add_tensor_info(tensor_name, byte_shape, np.dtype(np.uint8), int(np.prod(byte_shape)),
                                   raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    rng = np.random.default_rng(seed)
    for tensor_name, dims, qtype in plan:
        if qtype != T.F32:
            writer.write_tensor_data(random_blocks(rng, dims, qtype))
        elif tensor_name.endswith("norm.weight"):
            writer.write_tensor_data((1.0 + 0.1 * rng.standard_normal(dims)).astype(np.float32))
        elif tensor_name.endswith("ffn_gate_inp.weight"):  # router: logits of std ~3
            writer.write_tensor_data((3.0 / np.sqrt(dims[-1]) * rng.standard_normal(dims)).astype(np.float32))
        elif tensor_name.endswith("ssm_a"):  # -exp(A_log): decays within (0, 1)
            writer.write_tensor_data(-rng.uniform(1.0, 8.0, dims).astype(np.float32))
        elif tensor_name.endswith(("ssm_conv1d.weight", "ffn_gate_inp_shexp.weight")):
            writer.write_tensor_data((0.5 / np.sqrt(dims[-1]) * rng.standard_normal(dims)).astype(np.float32))
        else:  # biases, sinks
            writer.write_tensor_data((0.1 * rng.standard_normal(dims)).astype(np.float32))
    writer.close()
    return path


def check_with_llama_cpp(path: Path) -> list[float]:
    """Load the file with llama.cpp (llama-cpp-python) and evaluate a few tokens; return some logits."""
    import llama_cpp.llama as llama_module

    # This llama.cpp build (llama-cpp-python 0.3.36, CPU with AVX512/AMX) crashes (SIGSEGV) on
    # the first eval of a quantized MoE when weights go to its "extra" CPU buffer types
    # (repacking / AMX); plain CPU buffers work. Set SPRIG_LLAMA_EXTRA_BUFTS=1 to try them.
    default_params = llama_module.llama_cpp.llama_model_default_params

    def plain_buffers():
        params = default_params()
        params.use_extra_bufts = bool(os.environ.get("SPRIG_LLAMA_EXTRA_BUFTS"))
        return params

    llama_module.llama_cpp.llama_model_default_params = plain_buffers
    try:
        llm = llama_module.Llama(model_path=str(path), n_ctx=256, n_threads=2, logits_all=True, verbose=False)
    finally:
        llama_module.llama_cpp.llama_model_default_params = default_params
    llm.eval([300, 301, 302, 303])
    logits = np.asarray(llm.scores[llm.n_tokens - 1])
    llm.close()
    if not np.isfinite(logits).all():
        raise SystemExit(f"llama.cpp gave non-finite logits for {path}")
    return [float(x) for x in logits[:4]]


def main() -> None:
    """Write the model of `--shape` to `--out`, print its size and time, and optionally check it."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), required=True)
    parser.add_argument("--out", required=True, help="the .gguf file to write (not in the repository)")
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--check", action="store_true", help="load it with llama.cpp and evaluate 4 tokens")
    args = parser.parse_args()
    started = time.perf_counter()
    path = write_moe_shape(args.out, SHAPES[args.shape], seed=args.seed, name=f"{args.shape}-shape")
    print(f"{path}: {path.stat().st_size:,} bytes in {time.perf_counter() - started:.1f} s", flush=True)
    if args.check:
        started = time.perf_counter()
        logits = check_with_llama_cpp(path)
        print(f"llama.cpp loaded it and evaluated 4 tokens in {time.perf_counter() - started:.1f} s; logits {logits}")


if __name__ == "__main__":
    main()
