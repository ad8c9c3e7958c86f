"""Write synthetic GGUF files with the shapes of PrismML's 1-bit Bonsai models, for speed benchmarks.

Run with the app's venv from the repository root:

    .venv/bin/python -m tools.make_bonsai_shape --shape 1.7b --out /work/models/bonsai-1.7b-shape-q1_0.gguf
    .venv/bin/python -m tools.make_bonsai_shape --shape 8b --out /work/models/bonsai-8b-shape-q1_0.gguf

Decode speed depends on a model's shapes and tensor types, not on what its weights say,
so a file with Bonsai's architecture (qwen3), dimensions and types times Sprig and
llama.cpp as the real model would, without downloading it:

- every matrix Q1_0 (GGML type 41), the token embeddings included; norms F32;
- as in the real models, the 1.7B ties its embeddings (no `output.weight`: the output
  projection is `token_embd.weight`, 247 MB in all, as Bonsai-1.7B's 0.24 GB) and the 8B
  does not (a Q1_0 `output.weight` of its own, 1.16 GB in all, as Bonsai-8B's 1.15 GB;
  Qwen3-8B's LM head is untied, which is what makes its 8.19B parameters);
- random weights: random sign bits, fp16 block scales around 1/sqrt(in_features), so
  that a projection keeps its input's scale; norm weights around 1.0;
- the tiny byte-level BPE vocabulary of tests/gguf_factory.py, padded with reserved
  tokens to Qwen3's 151,936, so that the engine and llama.cpp can build a tokenizer.

The output is deterministic (fixed seed), and written tensor by tensor: the 8B shape is
1.15 GB of blocks, but the float weights behind them would be 30 GB, so the blocks are
drawn directly (tools/make_synthetic_qwen3.py's `quantize_q1_0` needs the floats) and
each is written to the file before the next is drawn. At most one tensor is in memory
at a time (the largest, the 8B's embeddings: 88 MB); writing the 8B takes about 10 s.
"""

import argparse
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGUFWriter

from tests.gguf_factory import _value_type, model_metadata
from tools.make_synthetic_qwen3 import Q1_0, Q1_0_BLOCK, QWEN_TOKENIZER

ARCH = "qwen3"
Q1_0_BLOCK_BYTES = 18  # fp16 scale + 128 sign bits
SEED = 0


@dataclass(frozen=True)
class BonsaiShape:
    """The dimensions of a qwen3 model; every matrix dimension a multiple of 128 (a Q1_0 block)."""

    n_layers: int
    d_model: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    d_ff: int
    vocab: int = 151936
    tie_embeddings: bool = True  # no output.weight: the output projection is token_embd.weight
    # the published configs' max_position_embeddings (Qwen3-1.7B, -4B, -8B): the KV benchmark runs to 32k
    context_length: int = 40960  # rope base 1e6 and rms eps 1e-6 come from model_metadata's qwen3


# Bonsai's published configs (they are Qwen3-1.7B's and Qwen3-8B's).
SHAPES = {
    "1.7b": BonsaiShape(n_layers=28, d_model=2048, n_heads=16, n_kv_heads=8, head_dim=128, d_ff=6144),
    "8b": BonsaiShape(n_layers=36, d_model=4096, n_heads=32, n_kv_heads=8, head_dim=128, d_ff=12288,
                      tie_embeddings=False),
}


def random_q1_0_blocks(rng: np.random.Generator, rows: int, cols: int) -> np.ndarray:
    """Random Q1_0 blocks of a (rows, cols) matrix, cols a multiple of 128: (rows, cols / 128 * 18) bytes.

    Each 18-byte block is an fp16 scale d, then 16 bytes of sign bits, least significant
    bit first (bit 1 -> +d, bit 0 -> -d). The bits are uniform; d is 1/sqrt(cols) times
    (1 + 0.1 * N(0, 1)), so that a row's dot product with a vector keeps the vector's scale.
    """
    if cols % Q1_0_BLOCK:
        raise ValueError(f"a Q1_0 row must hold a multiple of {Q1_0_BLOCK} weights, not {cols}")
    n_blocks = cols // Q1_0_BLOCK
    scale = (1.0 + 0.1 * rng.standard_normal((rows, n_blocks), dtype=np.float32)) / np.sqrt(cols)
    scale_bytes = scale.astype(np.float16)[..., None].view(np.uint8)  # (rows, n_blocks, 1) -> (rows, n_blocks, 2)
    bits = rng.integers(0, 256, size=(rows, n_blocks, Q1_0_BLOCK // 8), dtype=np.uint8)  # (rows, n_blocks, 16)
    blocks = np.concatenate([scale_bytes, bits], axis=-1)  # (rows, n_blocks, 18)
    return blocks.reshape(rows, n_blocks * Q1_0_BLOCK_BYTES)  # (rows, n_blocks * 18)


def bonsai_metadata(shape: BonsaiShape, name: str) -> dict[str, Any]:
    """The GGUF metadata of a qwen3 model of `shape`: tests/gguf_factory.py's keys and vocabulary."""
    metadata = model_metadata(ARCH, shape.n_layers, shape.d_model, shape.n_heads, shape.n_kv_heads, shape.head_dim,
                              shape.d_ff, shape.vocab, shape.context_length)
    return {**metadata, **QWEN_TOKENIZER, "general.name": name}


def tensor_plan(shape: BonsaiShape) -> list[tuple[str, tuple[int, ...]]]:
    """(name, NumPy shape) of every tensor, in file order; 2-D ones are (n_out, n_in) Q1_0 matrices."""
    d, q, kv = shape.d_model, shape.n_heads * shape.head_dim, shape.n_kv_heads * shape.head_dim
    layer = {
        "attn_norm.weight": (d,),
        "attn_q.weight": (q, d),
        "attn_k.weight": (kv, d),
        "attn_v.weight": (kv, d),
        "attn_output.weight": (d, q),
        "ffn_norm.weight": (d,),
        "ffn_gate.weight": (shape.d_ff, d),
        "ffn_up.weight": (shape.d_ff, d),
        "ffn_down.weight": (d, shape.d_ff),
        "attn_q_norm.weight": (shape.head_dim,),
        "attn_k_norm.weight": (shape.head_dim,),
    }
    plan = [("token_embd.weight", (shape.vocab, d))]
    for i in range(shape.n_layers):
        plan += [(f"blk.{i}.{name}", dims) for name, dims in layer.items()]
    plan.append(("output_norm.weight", (d,)))
    if not shape.tie_embeddings:
        plan.append(("output.weight", (shape.vocab, d)))
    return plan


def write_bonsai_shape(path: str | Path, shape: BonsaiShape, seed: int = SEED, name: str = "bonsai-shape") -> Path:
    """Write a random-weight qwen3 model of `shape` to `path`, one tensor at a time, and return the path.

    Two passes over `tensor_plan(shape)`: the first declares every tensor (name, type,
    size) for the header, the second draws each tensor and appends it to the file.
    """
    path = Path(path)
    plan = tensor_plan(shape)
    writer = GGUFWriter(path, ARCH)
    for key, value in bonsai_metadata(shape, name).items():
        writer.add_key_value(key, value, _value_type(value))
    for tensor_name, dims in plan:
        if len(dims) == 2:
            rows, cols = dims
            byte_shape = (rows, cols // Q1_0_BLOCK * Q1_0_BLOCK_BYTES)
            writer.add_tensor_info(tensor_name, byte_shape, np.dtype(np.uint8), rows * byte_shape[1], raw_dtype=Q1_0)
        else:
            writer.add_tensor_info(tensor_name, dims, np.dtype(np.float32), dims[0] * 4)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    rng = np.random.default_rng(seed)
    for _, dims in plan:
        if len(dims) == 2:
            writer.write_tensor_data(random_q1_0_blocks(rng, *dims))
        else:
            writer.write_tensor_data((1.0 + 0.1 * rng.standard_normal(dims)).astype(np.float32))
    writer.close()
    return path


def main() -> None:
    """Write the model of `--shape` to `--out` and print its size and the time taken."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), required=True)
    parser.add_argument("--out", required=True, help="the .gguf file to write")
    parser.add_argument("--seed", type=int, default=SEED)
    args = parser.parse_args()
    started = time.perf_counter()
    path = write_bonsai_shape(args.out, SHAPES[args.shape], seed=args.seed, name=f"bonsai-{args.shape}-shape")
    print(f"{path}: {path.stat().st_size:,} bytes in {time.perf_counter() - started:.1f} s")


if __name__ == "__main__":
    main()
