"""RoPE scaling against transformers' `ROPE_INIT_FUNCTIONS`: linear and YaRN from a file's
metadata, Llama 3's from the `rope_freqs.weight` llama.cpp's converter writes; the
frequencies each layer gets, and the rotation the rope op applies with them at a position
far past the original context (tools/fixtures/make_rope_scaling_references.py recorded the values)."""

import json
from pathlib import Path

import numpy as np
import pytest

from engine.loader import load_model
from tests.gguf_factory import write_tiny_model

REFERENCE = json.loads((Path(__file__).parent.parent / "fixtures" / "reference" / "rope_scaling.json").read_text())
DIM = REFERENCE["head_dim"]
POSITION = 3000  # far enough that the scaled frequencies turn differently, near enough for float32 angles


def metadata(case: str) -> dict:
    rope = REFERENCE[case]["rope"]
    keys = {"llama.rope.freq_base": rope["rope_theta"], "llama.context_length": 32768}
    if case != "llama3":  # Llama 3's scaling travels as a tensor, not as keys
        keys |= {"llama.rope.scaling.type": case, "llama.rope.scaling.factor": rope["factor"]}
    if case == "yarn":
        keys |= {
            "llama.rope.scaling.original_context_length": rope["original_max_position_embeddings"],
            "llama.rope.scaling.yarn_beta_fast": rope["beta_fast"],
            "llama.rope.scaling.yarn_beta_slow": rope["beta_slow"],
        }
    return keys


@pytest.fixture(params=["linear", "llama3", "yarn"])
def scaled(request, tmp_path):
    case = request.param
    factors = REFERENCE["llama3"]["converter_rope_freqs"]
    path = write_tiny_model(
        tmp_path / f"{case}.gguf",
        arch="llama",
        d_model=4 * DIM,
        n_heads=4,
        n_kv_heads=2,
        head_dim=DIM,
        extra_tensors={"rope_freqs.weight": (DIM // 2,)} if case == "llama3" else None,
        tensor_values={"rope_freqs.weight": np.array(factors)} if case == "llama3" else None,
        **metadata(case),
    )
    loaded = load_model(path, backend="numpy")
    yield case, loaded
    loaded.close()


def test_each_layer_gets_transformers_frequencies(scaled):
    case, loaded = scaled
    rope = loaded.model.layer_rope(0)
    inv_freq = rope.base ** (-np.arange(0, DIM, 2, dtype=np.float64) / DIM) / rope.freq_factors
    np.testing.assert_allclose(inv_freq, REFERENCE[case]["inv_freq"], rtol=2e-6)
    assert rope.mscale == pytest.approx(REFERENCE[case]["attention_factor"], rel=1e-9)


@pytest.mark.parametrize("backend", ["numpy", "cpu"])
def test_the_rope_op_turns_queries_as_transformers_would(scaled, backend):
    case, loaded = scaled
    rope = loaded.model.layer_rope(0)
    x = np.random.default_rng(0).standard_normal((1, 2, DIM)).astype(np.float32)  # (T, heads, Dh)
    ops = load_model(loaded.path, backend=backend)
    got = ops.backend.to_host(
        ops.backend.rope(x, np.array([POSITION]), rope.base, DIM, False, rope.freq_factors, rope.mscale)
    )
    ops.close()
    angles = POSITION * np.array(REFERENCE[case]["inv_freq"])  # (Dh / 2,)
    cos, sin = (
        np.cos(angles) * REFERENCE[case]["attention_factor"],
        np.sin(angles) * REFERENCE[case]["attention_factor"],
    )
    a, b = x[..., 0::2], x[..., 1::2]  # adjacent pairs: llama.cpp's layout for Llama files
    expected = np.stack([a * cos - b * sin, a * sin + b * cos], axis=-1).reshape(x.shape)  # (T, heads, Dh)
    np.testing.assert_allclose(got, expected, rtol=0, atol=2e-3)
