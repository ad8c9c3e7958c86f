"""tools/fixtures/make_bonsai_shape.py: its Q1_0 blocks read back as ±d, and its files open as the shape says.

The benchmark files themselves (247 MB and 1.16 GB) are not written here: a 2-layer,
hidden-128 shape goes through the same writer.
"""

from dataclasses import replace

import numpy as np
import pytest
from gguf import GGMLQuantizationType

from backends.dequant import dequantize
from engine.models import read_config
from engine.gguf_file import open_gguf
from tools.fixtures.make_bonsai_shape import SHAPES, BonsaiShape, random_q1_0_blocks, tensor_plan, write_bonsai_shape

Q1_0 = int(GGMLQuantizationType.Q1_0)
F32 = int(GGMLQuantizationType.F32)
TINY = BonsaiShape(n_layers=2, d_model=128, n_heads=4, n_kv_heads=2, head_dim=32, d_ff=256, vocab=288)


def test_blocks_dequantize_to_plus_or_minus_their_scale():
    rows, cols = 5, 384
    blocks = random_q1_0_blocks(np.random.default_rng(1), rows, cols)
    assert blocks.dtype == np.uint8 and blocks.shape == (rows, cols // 128 * 18)

    per_block = blocks.reshape(rows, cols // 128, 18)  # (rows, n_blocks, 18)
    d = per_block[..., :2].copy().view(np.float16).astype(np.float32)  # (rows, n_blocks, 1)
    bits = np.unpackbits(per_block[..., 2:], axis=-1, bitorder="little")  # (rows, n_blocks, 128)
    expected = np.where(bits == 1, d, -d).reshape(rows, cols)  # (rows, n_blocks * 128)

    values = dequantize(blocks, Q1_0, (rows, cols))
    np.testing.assert_array_equal(values, expected)
    assert 0.3 < bits.mean() < 0.7  # both signs occur
    assert np.all((0.5 < d * np.sqrt(cols)) & (d * np.sqrt(cols) < 1.5))  # scales around 1/sqrt(in_features)


def test_blocks_need_whole_blocks_per_row():
    with pytest.raises(ValueError, match="multiple of 128"):
        random_q1_0_blocks(np.random.default_rng(0), 2, 100)


def test_the_benchmark_shapes_are_bonsais():
    # Bonsai-1.7B: 1.7B parameters, tied; Bonsai-8B: 8.19B parameters, its own LM head.
    counts = {name: sum(int(np.prod(dims)) for _, dims in tensor_plan(shape)) for name, shape in SHAPES.items()}
    assert round(counts["1.7b"] / 1e8) == 17 and round(counts["8b"] / 1e7) == 819
    assert (SHAPES["1.7b"].n_layers, SHAPES["1.7b"].d_model, SHAPES["1.7b"].d_ff) == (28, 2048, 6144)
    assert (SHAPES["8b"].n_layers, SHAPES["8b"].d_model, SHAPES["8b"].d_ff) == (36, 4096, 12288)


@pytest.mark.parametrize("tied", [True, False])
def test_a_tiny_shape_opens_with_its_hyperparameters(tmp_path, tied):
    shape = replace(TINY, tie_embeddings=tied)
    path = write_bonsai_shape(tmp_path / "tiny.gguf", shape, seed=7)
    f = open_gguf(path)
    c = read_config(f)

    assert c.architecture == "qwen3" and c.tie_embeddings == tied
    assert {"blk.1.attn_q_norm.weight", "blk.1.attn_k_norm.weight"} <= set(f.tensors)
    assert (c.n_layers, c.d_model, c.n_heads, c.n_kv_heads, c.head_dim, c.d_ff) == (2, 128, 4, 2, 32, 256)
    assert (c.vocab_size, c.context_length, c.rope_base) == (288, 40960, 1e6)
    assert c.norm_eps == pytest.approx(1e-6)
    assert len(f.get("tokenizer.ggml.tokens")) == 288
    assert ("output.weight" in f.tensors) != tied
    for info in f.tensors.values():
        assert info.ggml_type == (Q1_0 if len(info.shape) == 2 else F32), info.name
        if len(info.shape) == 1:  # norms
            assert abs(float(np.mean(dequantize(info.data, F32, info.shape))) - 1.0) < 0.1, info.name

    # token_embd.weight is the first tensor drawn: the file holds the blocks the seed gives.
    embd = f.tensors["token_embd.weight"]
    assert embd.shape == (288, 128)
    np.testing.assert_array_equal(embd.data.reshape(288, 18), random_q1_0_blocks(np.random.default_rng(7), 288, 128))
