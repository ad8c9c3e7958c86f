"""Write random-weight qwen3 GGUF files in llama.cpp's quantization mixes, for the quant-type benchmark.

Run from the repository root with the app's venv (`--check` needs a venv with llama-cpp-python too):

    .venv/bin/python -m tools.make_dense_shape --shape qwen3-4b --mix Q3_K_M \
        --out /work/models/qwen3-4b-shape-q3_k_m.gguf
    .venv/bin/python -m tools.make_dense_shape --all --dir /work/models
    .venv/bin/python -m tools.make_dense_shape --shape qwen3-4b --mix Q3_K_M --layers 9 \
        --out /work/models/qwen3-4b-shape-9-layers-q3_k_m.gguf   # a quarter of its layers

`--all` writes the benchmark set of docs/benchmarks.md: the "Qwen3-4B shape" in Q3_K_M, Q2_K,
IQ4_XS, IQ2_XXS and TQ2_0, and the Bonsai-8B shape in TQ2_0.

The layout (qwen3, tensor order, metadata, tokenizer) is tools/make_bonsai_shape.py's; the
blocks are drawn directly as tools/make_moe_shape.py draws them: uniform random bytes, with
every fp16 scale field set so that a row's weights have a root mean square of about
1/sqrt(in_features) (measured on a sample dequantized by gguf-py), so that a projection keeps
its input's scale. The type of each tensor follows llama.cpp's `llama_tensor_get_type`
(src/llama-quant.cpp) for the mix and this shape (GQA 4, no experts): `mix_type` below.
"""

import argparse
import dataclasses
import time
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGUFWriter
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize

from tests.gguf_factory import _value_type
from tools.make_bonsai_shape import SEED, SHAPES, BonsaiShape, bonsai_metadata, tensor_plan

# The Qwen3-4B config (tied embeddings, as Qwen3-4B's tie_word_embeddings).
DENSE_SHAPES = {
    "qwen3-4b": BonsaiShape(n_layers=36, d_model=2560, n_heads=32, n_kv_heads=8, head_dim=128, d_ff=9728),
    "bonsai-8b": SHAPES["8b"],
}
# byte offsets of each block's fp16 scale fields (d, and dmin where there is one)
FP16_FIELDS = {
    T.Q4_0: (0,),
    T.Q8_0: (0,),
    T.Q2_K: (80, 82),
    T.Q3_K: (108,),
    T.Q4_K: (0, 2),
    T.Q5_K: (0, 2),
    T.Q6_K: (208,),
    T.IQ4_XS: (0,),
    T.IQ2_XXS: (0,),
    T.TQ2_0: (64,),
}
BENCHMARK_SET = [
    ("qwen3-4b", "Q3_K_M"),
    ("qwen3-4b", "Q2_K"),
    ("qwen3-4b", "IQ4_XS"),
    ("qwen3-4b", "IQ2_XXS"),
    ("qwen3-4b", "TQ2_0"),
    ("bonsai-8b", "TQ2_0"),
]
BASE_TYPE = {
    "Q3_K_M": T.Q3_K,
    "Q2_K": T.Q2_K,
    "IQ4_XS": T.IQ4_XS,
    "IQ2_XXS": T.IQ2_XXS,
    "TQ2_0": T.TQ2_0,
    "Q4_K_M": T.Q4_K,
    "Q4_0": T.Q4_0,
    "Q8_0": T.Q8_0,
}


def use_more_bits(layer: int, n_layers: int) -> bool:
    """llama.cpp's use_more_bits: the first and last eighth of the layers, and every third between."""
    return layer < n_layers // 8 or layer >= 7 * n_layers // 8 or (layer - n_layers // 8) % 3 == 2


def mix_type(mix: str, name: str, layer: int, n_layers: int, tied: bool) -> T:
    """The type llama.cpp's quantizer gives tensor `name` (of block `layer`) in `mix`, for a model with GQA 4."""
    base = BASE_TYPE[mix]
    if name == "output.weight" or (tied and name == "token_embd.weight"):
        return T.Q5_K if mix == "IQ2_XXS" else T.Q8_0 if mix == "Q8_0" else T.Q6_K
    if name == "token_embd.weight":
        return {T.IQ2_XXS: T.Q2_K, T.TQ2_0: T.Q4_K}.get(base, base)
    role = name.rsplit(".", 2)[-2]  # blk.3.attn_v.weight -> attn_v
    if mix == "Q4_K_M" and role in ("attn_v", "ffn_down"):
        return T.Q6_K if use_more_bits(layer, n_layers) else T.Q4_K
    if role == "attn_v":
        return {"Q3_K_M": T.Q5_K if layer < 2 else T.Q4_K, "Q2_K": T.Q4_K, "IQ4_XS": T.Q5_K, "IQ2_XXS": T.Q4_K}.get(
            mix, base
        )
    if role == "ffn_down":
        if mix == "Q3_K_M":
            return T.Q5_K if layer < n_layers // 16 else T.Q4_K
        if mix == "Q2_K":
            return T.Q3_K
        if mix in ("IQ4_XS", "IQ2_XXS") and layer < n_layers // 8:
            return T.Q5_K if mix == "IQ4_XS" else T.Q2_K
    if role == "attn_output":
        return {"Q3_K_M": T.Q4_K, "Q2_K": T.Q3_K}.get(mix, base)
    return base


def block_scale(qtype: T, cols: int, rng: np.random.Generator) -> float:
    """The fp16 scale that gives random blocks of `qtype` a root mean square of 1/sqrt(cols)."""
    nbytes = GGML_QUANT_SIZES[qtype][1]
    sample = np.frombuffer(rng.bytes(64 * nbytes), dtype=np.uint8).reshape(64, nbytes).copy()
    for at in FP16_FIELDS[qtype]:
        sample[:, at : at + 2] = np.full((64, 1), 1.0, dtype=np.float16).view(np.uint8)
    values = dequantize(sample, qtype)  # (64, weights)
    return float(1.0 / np.sqrt(cols) / np.sqrt(np.mean(values.astype(np.float64) ** 2)))


def random_blocks(rng: np.random.Generator, rows: int, cols: int, qtype: T, scale: float) -> np.ndarray:
    """Random blocks of a (rows, cols) matrix of `qtype`, every fp16 field `scale`: (rows, row bytes) uint8."""
    weights, nbytes = GGML_QUANT_SIZES[qtype]
    n_blocks = rows * (cols // weights)
    blocks = np.frombuffer(rng.bytes(n_blocks * nbytes), dtype=np.uint8).reshape(n_blocks, nbytes).copy()
    for at in FP16_FIELDS[qtype]:
        blocks[:, at : at + 2] = np.full((n_blocks, 1), scale, dtype=np.float16).view(np.uint8)
    return blocks.reshape(rows, cols // weights * nbytes)  # (rows, blocks per row * bytes)


def write_dense_shape(path: str | Path, shape: BonsaiShape, mix: str, seed: int = SEED, name: str = "shape") -> Path:
    """Write a random-weight qwen3 model of `shape` in llama.cpp's `mix`, one tensor at a time; return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    plan = []
    for tensor_name, dims in tensor_plan(shape):
        layer = int(tensor_name.split(".")[1]) if tensor_name.startswith("blk.") else 0
        qtype = mix_type(mix, tensor_name, layer, shape.n_layers, shape.tie_embeddings) if len(dims) == 2 else T.F32
        plan.append((tensor_name, dims, qtype))
    writer = GGUFWriter(path, "qwen3")
    for key, value in bonsai_metadata(shape, name).items():
        writer.add_key_value(key, value, _value_type(value))
    for tensor_name, dims, qtype in plan:
        if qtype == T.F32:
            writer.add_tensor_info(tensor_name, dims, np.dtype(np.float32), dims[0] * 4)
        else:
            weights, nbytes = GGML_QUANT_SIZES[qtype]
            byte_shape = (dims[0], dims[1] // weights * nbytes)
            writer.add_tensor_info(
                tensor_name, byte_shape, np.dtype(np.uint8), byte_shape[0] * byte_shape[1], raw_dtype=qtype
            )
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    rng = np.random.default_rng(seed)
    for _, dims, qtype in plan:
        if qtype == T.F32:
            writer.write_tensor_data((1.0 + 0.1 * rng.standard_normal(dims)).astype(np.float32))
        else:
            writer.write_tensor_data(random_blocks(rng, *dims, qtype, block_scale(qtype, dims[1], rng)))
    writer.close()
    return path


def main() -> None:
    """Write one shape and mix to `--out`, or the whole benchmark set into `--dir`; optionally check each."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(DENSE_SHAPES))
    parser.add_argument("--mix", choices=sorted(BASE_TYPE))
    parser.add_argument("--out", help="the .gguf file to write (not in the repository)")
    parser.add_argument("--all", action="store_true", help="write the benchmark set into --dir")
    parser.add_argument("--dir", default="/work/models")
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument(
        "--layers", type=int, help="keep only the first N blocks (a shape with fewer layers: same per-layer work)"
    )
    parser.add_argument("--check", action="store_true", help="load each with llama.cpp and evaluate 4 tokens")
    args = parser.parse_args()
    if args.all:
        jobs = [(s, m, Path(args.dir) / f"{s}-shape-{m.lower()}.gguf") for s, m in BENCHMARK_SET]
    elif args.shape and args.mix and args.out:
        jobs = [(args.shape, args.mix, Path(args.out))]
    else:
        parser.error("give --shape, --mix and --out, or --all")
    for shape, mix, out in jobs:
        started = time.perf_counter()
        dims = DENSE_SHAPES[shape]
        if args.layers:
            dims = dataclasses.replace(dims, n_layers=args.layers)
        path = write_dense_shape(out, dims, mix, seed=args.seed, name=f"{shape}-shape-{mix}")
        print(f"{path}: {path.stat().st_size:,} bytes in {time.perf_counter() - started:.1f} s", flush=True)
        if args.check:
            from tools.make_moe_shape import check_with_llama_cpp

            print(f"llama.cpp logits {check_with_llama_cpp(path)}", flush=True)


if __name__ == "__main__":
    main()
