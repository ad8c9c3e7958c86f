"""ModelConfig: the bundled models against their published configs, and synthetic files."""

import math
import re

import numpy as np
import pytest
from gguf import GGMLQuantizationType

from engine.bundled import bundled_model
from engine.config import ModelConfig
from engine.models import read_config
from engine.errors import ModelFileError, UnsupportedModelError
from engine.gguf_file import open_gguf
from tests.gguf_factory import write_mamba_model, write_tiny_model


def config_of(path) -> ModelConfig:
    return read_config(open_gguf(path))


@pytest.fixture(scope="module")
def smollm2() -> ModelConfig:
    return config_of(bundled_model("smollm2").path)


@pytest.fixture(scope="module")
def gemma3() -> ModelConfig:
    return config_of(bundled_model("gemma3").path)


def test_smollm2_matches_its_published_config(smollm2):
    # HuggingFaceTB/SmolLM2-135M-Instruct config.json: LlamaForCausalLM, hidden_size 576,
    # 30 layers, 9 heads, 3 KV heads, intermediate 1536, vocab 49152, rope_theta 100000,
    # rms_norm_eps 1e-5, max_position_embeddings 8192, tie_word_embeddings true.
    c = smollm2
    assert c.architecture == "llama"
    assert (c.n_layers, c.d_model, c.n_heads, c.n_kv_heads) == (30, 576, 9, 3)
    assert (c.head_dim, c.value_head_dim, c.rope_dim) == (64, 64, 64)
    assert (c.d_ff, c.vocab_size, c.context_length) == (1536, 49152, 8192)
    assert c.rope_base == 100000.0
    assert c.norm_eps == pytest.approx(1e-5)
    assert c.tie_embeddings
    assert c.rope_neox is False  # llama.cpp's converter permuted q/k for pairwise RoPE
    assert (c.activation, c.embedding_scale) == ("silu", 1.0)
    assert c.attn_scale == pytest.approx(1 / 8)
    assert c.sliding_window is None and not any(c.is_sliding(i) for i in range(30))


def test_gemma3_matches_its_published_config(gemma3):
    # google/gemma-3-270m config.json: hidden_size 640, 18 layers, 4 heads, 1 KV head,
    # head_dim 256, intermediate 2048, vocab 262144, sliding_window 512, rope_theta 1e6,
    # rope_local_base_freq 10000, rms_norm_eps 1e-6, query_pre_attn_scalar 256,
    # max_position_embeddings 32768, hidden_activation gelu_pytorch_tanh, layers 5, 11, 17 global.
    c = gemma3
    assert c.architecture == "gemma3"
    assert (c.n_layers, c.d_model, c.n_heads, c.n_kv_heads) == (18, 640, 4, 1)
    assert (c.head_dim, c.value_head_dim, c.rope_dim) == (256, 256, 256)
    assert (c.d_ff, c.vocab_size, c.context_length) == (2048, 262144, 32768)
    assert c.sliding_window == 512
    assert [i for i in range(18) if not c.is_sliding(i)] == [5, 11, 17]
    assert c.layer_rope_base(5) == 1e6 and c.layer_rope_base(0) == 10000.0
    assert c.norm_eps == pytest.approx(1e-6)
    assert c.attn_scale == pytest.approx(1 / 16)
    assert c.tie_embeddings and c.rope_neox
    assert c.activation == "gelu_tanh"
    assert c.embedding_scale == pytest.approx(math.sqrt(640))
    assert c.attn_logit_softcap is None and c.final_logit_softcap is None


def test_qwen3_detects_tied_embeddings(tmp_path):
    tied = config_of(write_tiny_model(tmp_path / "tied.gguf", arch="qwen3", tie_embeddings=True))
    untied = config_of(write_tiny_model(tmp_path / "untied.gguf", arch="qwen3"))
    assert tied.tie_embeddings is True
    assert untied.tie_embeddings is False
    assert tied.rope_neox


def test_qwen3_head_dim_comes_from_key_length(tmp_path):
    # Like Qwen3-8B (4096 / 32 heads = 128 = head_dim) but with a head wider than d_model / n_heads.
    c = config_of(write_tiny_model(tmp_path / "wide.gguf", arch="qwen3", d_model=64, n_heads=4, head_dim=32))
    assert c.head_dim == 32
    assert c.attn_scale == pytest.approx(1 / math.sqrt(32))


def test_head_dim_defaults_to_d_model_over_heads(tmp_path):
    path = write_tiny_model(
        tmp_path / "m.gguf", arch="llama", d_model=96, n_heads=4, head_dim=24,
        **{"llama.attention.key_length": None, "llama.attention.value_length": None},
    )
    c = config_of(path)
    assert (c.head_dim, c.value_head_dim, c.rope_dim) == (24, 24, 24)


def test_bonsai_style_q1_0_qwen3_opens(tmp_path):
    # Q1_0: 128 weights in 18 bytes. Zero bytes are a valid block (scale 0).
    def q1_0_zeros(values, qtype):
        return np.zeros((values.shape[0], values.shape[1] // 128 * 18), np.uint8)  # (rows, bytes per row)

    path = write_tiny_model(
        tmp_path / "bonsai.gguf", arch="qwen3", d_model=128, n_heads=4, head_dim=32, d_ff=256,
        tensor_type=GGMLQuantizationType.Q1_0, quantize=q1_0_zeros,
    )
    f = open_gguf(path)
    c = read_config(f)
    q = f.tensors["blk.0.attn_q.weight"]
    assert (q.type_name, q.shape, q.n_bytes) == ("Q1_0", (128, 128), 128 * 18)
    assert c.architecture == "qwen3" and c.vocab_size == 288


def test_vocab_size_comes_from_the_embedding(tmp_path):
    path = write_tiny_model(tmp_path / "v.gguf", arch="qwen3", vocab=300, **{"qwen3.vocab_size": 1000})
    assert config_of(path).vocab_size == 300


def test_qwen2_rotates_halves(tmp_path):
    c = config_of(write_tiny_model(tmp_path / "q2.gguf", arch="qwen2"))
    assert c.rope_neox and (c.activation, c.embedding_scale) == ("silu", 1.0)


# What each family needs beyond the shared layout, from llama.cpp's tensor lists
# (llama-arch.cpp): a file of that architecture without one of them cannot be used.
@pytest.mark.parametrize(
    ("arch", "needed"),
    [
        ("qwen2", "attn_v.bias"),
        ("qwen3", "attn_q_norm.weight"),
        ("gemma2", "post_attention_norm.weight"),
        ("gemma2", "post_ffw_norm.weight"),
        ("gemma3", "post_ffw_norm.weight"),
        ("gemma3", "attn_k_norm.weight"),
    ],
)
def test_each_family_needs_its_own_tensors(tmp_path, arch, needed):
    path = write_tiny_model(tmp_path / "m.gguf", arch=arch, n_layers=2, omit_tensors=(f"blk.1.{needed}",))
    with pytest.raises(ModelFileError, match=re.escape(f"blk.1.{needed}")):
        config_of(path)


def test_gemma2_alternates_layers_and_soft_caps(tmp_path):
    c = config_of(write_tiny_model(tmp_path / "g2.gguf", arch="gemma2", n_layers=4))
    assert [c.is_sliding(i) for i in range(4)] == [True, False, True, False]
    assert (c.attn_logit_softcap, c.final_logit_softcap) == (50.0, 30.0)
    assert c.embedding_scale == 8.0
    capped = config_of(write_tiny_model(
        tmp_path / "g2b.gguf", arch="gemma2",
        **{"gemma2.attn_logit_softcapping": 20.0, "gemma2.final_logit_softcapping": 15.0},
    ))
    assert (capped.attn_logit_softcap, capped.final_logit_softcap) == (20.0, 15.0)


def test_gemma3_local_layers_use_base_10000(tmp_path):
    c = config_of(write_tiny_model(tmp_path / "g3.gguf", arch="gemma3", n_layers=12))
    assert [i for i in range(12) if not c.is_sliding(i)] == [5, 11]
    assert [c.layer_rope_base(i) for i in (4, 5)] == [10000.0, 1e6]
    assert c.sliding_window == 16


def test_rope_scaling_is_recorded(tmp_path):
    path = write_tiny_model(
        tmp_path / "s.gguf", arch="llama",
        **{"llama.rope.scaling.type": "linear", "llama.rope.scaling.factor": 8.0, "llama.rope.dimension_count": 8},
    )
    c = config_of(path)
    assert (c.rope_scaling_type, c.rope_scaling_factor, c.rope_dim) == ("linear", 8.0, 8)
    plain = config_of(write_tiny_model(tmp_path / "p.gguf", arch="llama"))
    assert (plain.rope_scaling_type, plain.rope_scaling_factor) == (None, None)
    none = config_of(write_tiny_model(tmp_path / "n.gguf", arch="llama", **{"llama.rope.scaling.type": "none"}))
    assert none.rope_scaling_type is None


def test_unsupported_architecture_is_named(tmp_path):
    path = write_mamba_model(tmp_path / "mamba.gguf")
    with pytest.raises(UnsupportedModelError) as caught:
        config_of(path)
    message = str(caught.value)
    assert "'mamba'" in message and "mamba.gguf" in message
    assert all(arch in message for arch in ("llama", "qwen2", "qwen3", "gemma3"))


def test_missing_tensor_is_named(tmp_path):
    path = write_tiny_model(tmp_path / "m.gguf", arch="qwen3", omit_tensors=("blk.1.attn_k_norm.weight",))
    with pytest.raises(ModelFileError, match=r"blk\.1\.attn_k_norm\.weight") as caught:
        config_of(path)
    assert "m.gguf" in str(caught.value)


def test_an_optional_tensor_a_file_has_is_checked_too(tmp_path):
    # Llama needs no q bias, but a file that has one must give it the q projection's size.
    good = write_tiny_model(tmp_path / "b.gguf", arch="llama", extra_tensors={"blk.1.attn_q.bias": (64,)})
    assert config_of(good).n_layers == 2
    bad = write_tiny_model(tmp_path / "w.gguf", arch="llama", extra_tensors={"blk.1.attn_q.bias": (63,)})
    with pytest.raises(ModelFileError, match=r"blk\.1\.attn_q\.bias.*\(63,\).*\(64,\)"):
        config_of(bad)


@pytest.mark.parametrize("missing", ["token_embd.weight", "output_norm.weight", "blk.0.attn_q.bias"])
def test_other_missing_tensors_are_named(tmp_path, missing):
    path = write_tiny_model(tmp_path / "m.gguf", arch="qwen2", omit_tensors=(missing,))
    with pytest.raises(ModelFileError, match=missing.replace(".", r"\.")):
        config_of(path)


@pytest.mark.parametrize("key", ["block_count", "embedding_length", "attention.head_count",
                                 "feed_forward_length", "context_length", "attention.layer_norm_rms_epsilon"])
def test_missing_required_key_is_named(tmp_path, key):
    path = write_tiny_model(tmp_path / "k.gguf", arch="llama", **{f"llama.{key}": None})
    with pytest.raises(ModelFileError, match=f"llama.{key}".replace(".", r"\.")) as caught:
        config_of(path)
    assert "k.gguf" in str(caught.value)


def test_gemma_needs_its_sliding_window(tmp_path):
    path = write_tiny_model(tmp_path / "g.gguf", arch="gemma3", **{"gemma3.attention.sliding_window": None})
    with pytest.raises(ModelFileError, match=r"gemma3\.attention\.sliding_window"):
        config_of(path)


def test_shape_disagreeing_with_metadata_is_reported(tmp_path):
    # The file says 32-wide heads but its projections were written for 16-wide ones.
    path = write_tiny_model(tmp_path / "s.gguf", arch="qwen3", **{"qwen3.attention.key_length": 32})
    with pytest.raises(ModelFileError, match=r"blk\.0\.attn_q\.weight.*\(64, 64\).*\(128, 64\)"):
        config_of(path)


def test_embedding_must_match_d_model(tmp_path):
    path = write_tiny_model(tmp_path / "o.gguf", arch="llama", **{"llama.embedding_length": 32})
    with pytest.raises(ModelFileError, match=r"token_embd\.weight.*\(288, 64\)"):
        config_of(path)


@pytest.mark.parametrize("override", [
    {"llama.block_count": "two"},
    {"llama.block_count": 0},
    {"llama.attention.head_count": [4, 4]},
    {"llama.attention.head_count_kv": 3},
    {"llama.attention.layer_norm_rms_epsilon": -1.0},
    {"llama.rope.dimension_count": 15},
    {"llama.rope.dimension_count": 32},
    {"llama.rope.scaling.type": 2},
    {"llama.rope.scaling.factor": 0.0},
])
def test_impossible_hyperparameters_are_rejected(tmp_path, override):
    path = write_tiny_model(tmp_path / "h.gguf", arch="llama", **override)
    with pytest.raises(ModelFileError) as caught:
        config_of(path)
    assert "h.gguf" in str(caught.value)


def test_absurd_block_count_fails_fast(tmp_path):
    path = write_tiny_model(tmp_path / "b.gguf", arch="llama", **{"llama.block_count": 2**31})
    with pytest.raises(ModelFileError, match=r"blk\.2\.attn_norm\.weight"):
        config_of(path)
