"""Write the tiny synthetic Qwen3 GGUF files that stand in for PrismML's Bonsai models.

Run with the app's venv from the repository root:

    .venv/bin/python -m tools.make_synthetic_qwen3

It writes, deterministically (fixed seeds), with tests/gguf_factory.py's writer:

- `tests/fixtures/models/tiny-qwen3-f32.gguf`: every tensor F32, an untied output matrix;
  d_model (32) differs from n_heads * head_dim (64), as in the real Qwen3 models.
  Its reference numbers come from transformers (tools/make_transformers_fixtures.py).
- `tests/fixtures/models/tiny-qwen3-q1_0.gguf`: every matrix Q1_0 (type 41), the token
  embeddings included; norms F32; tied embeddings (no `output.weight`). gguf-py can name
  Q1_0 but not quantize it, so `quantize_q1_0` writes the blocks.
"""

from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType

from tests.gguf_factory import write_tiny_model

ROOT = Path(__file__).resolve().parent.parent
MODELS_DIR = ROOT / "tests" / "fixtures" / "models"
Q1_0 = GGMLQuantizationType.Q1_0
Q1_0_BLOCK = 128  # weights per block; a block is 18 bytes

# Qwen3's (and Bonsai's) word splitting, which transformers' GGUF tokenizer also knows.
QWEN_TOKENIZER = {"tokenizer.ggml.pre": "qwen2"}
F32_SHAPES = dict(arch="qwen3", n_layers=2, d_model=32, n_heads=4, n_kv_heads=2, head_dim=16, d_ff=96,
                  vocab=288, seed=3, tie_embeddings=False, **QWEN_TOKENIZER)
Q1_0_SHAPES = dict(arch="qwen3", n_layers=2, d_model=128, n_heads=4, n_kv_heads=2, head_dim=32, d_ff=256,
                   vocab=288, seed=4, tie_embeddings=True, **QWEN_TOKENIZER)


def quantize_q1_0(weights: np.ndarray, tensor_type: GGMLQuantizationType = Q1_0) -> np.ndarray:
    """Q1_0 blocks of a (rows, cols) float matrix, cols a multiple of 128: (rows, cols / 128 * 18) bytes.

    Block layout, 18 bytes for 128 weights:

        | d: fp16 | 16 bytes of sign bits, least significant bit first |

    Weight j of the block is +d if bit j is 1, else -d. d is the block's mean |w|, the
    scale that minimises the squared error of a sign code.
    """
    assert tensor_type == Q1_0, tensor_type
    rows, cols = weights.shape
    blocks = weights.reshape(rows, cols // Q1_0_BLOCK, Q1_0_BLOCK)  # (rows, n_blocks, 128)
    scale = np.abs(blocks).mean(axis=-1).astype(np.float16)  # (rows, n_blocks)
    bits = np.packbits(blocks >= 0, axis=-1, bitorder="little")  # (rows, n_blocks, 16)
    packed = np.concatenate([scale[..., None].view(np.uint8), bits], axis=-1)  # (rows, n_blocks, 18)
    return packed.reshape(rows, -1)  # (rows, n_blocks * 18)


def main() -> None:
    """Write both tiny models into tests/fixtures/models/."""
    MODELS_DIR.mkdir(parents=True, exist_ok=True)
    written = [
        write_tiny_model(MODELS_DIR / "tiny-qwen3-f32.gguf", **F32_SHAPES),
        write_tiny_model(MODELS_DIR / "tiny-qwen3-q1_0.gguf", **Q1_0_SHAPES, tensor_type=Q1_0,
                         quantize=quantize_q1_0),
    ]
    for path in written:
        print(f"{path.relative_to(ROOT)}: {path.stat().st_size:,} bytes")


if __name__ == "__main__":
    main()
