"""Mixture-of-experts models (Qwen3-MoE, gpt-oss) on the NumPy reference and on MLX: the
file's hyperparameters, routing worked out by hand, the expert mixture against a float64
textbook one, the experts a token did not choose never read, and MLX against NumPy."""

import importlib.util
import math

import numpy as np
import pytest
from gguf import GGMLQuantizationType

from backends.base import Routing
from backends.numpy_backend import NumpyBackend
from engine.errors import ModelFileError
from engine.loader import load_model
from engine.models import read_config
from engine.models.rope_scaling import yarn_divisors, yarn_mscale
from engine.gguf_file import open_gguf
from tests.gguf_factory import N_EXPERTS, N_EXPERTS_USED, write_tiny_model

MOE = ["qwen3moe", "gpt-oss"]


@pytest.mark.parametrize("arch", MOE)
def test_the_files_experts_and_their_routing_are_read(tmp_path, arch):
    config = read_config(open_gguf(write_tiny_model(tmp_path / "m.gguf", arch=arch)))
    assert (config.n_experts, config.n_experts_used, config.d_expert) == (N_EXPERTS, N_EXPERTS_USED, 128)
    assert config.expert_routing == {"qwen3moe": "softmax_top_k", "gpt-oss": "top_k_softmax"}[arch]
    assert config.activation == {"qwen3moe": "silu", "gpt-oss": "swiglu_oai"}[arch]


def test_gpt_oss_layers_alternate_windows_and_carry_sinks(tmp_path):
    loaded = load_model(write_tiny_model(tmp_path / "g.gguf", arch="gpt-oss", n_layers=4), backend="numpy")
    try:
        settings = [layer.mixer.settings for layer in loaded.model.layers]
        assert [s.window for s in settings] == [16, None, 16, None]  # even layers slide, as llama.cpp's pattern 2
        assert all(s.sinks is not None and s.sinks.shape == (4,) for s in settings)
    finally:
        loaded.close()


@pytest.mark.parametrize(("arch", "missing"), [("qwen3moe", "blk.1.ffn_down_exps.weight"),
                                               ("gpt-oss", "blk.0.attn_sinks.weight"),
                                               ("gpt-oss", "blk.1.ffn_gate_inp.bias")])
def test_a_missing_expert_tensor_is_named(tmp_path, arch, missing):
    path = write_tiny_model(tmp_path / "m.gguf", arch=arch, omit_tensors=(missing,))
    with pytest.raises(ModelFileError, match=missing.replace(".", r"\.")):
        read_config(open_gguf(path))


def test_a_misshaped_expert_stack_is_named(tmp_path):
    # five experts in the stack, but the file says four
    path = write_tiny_model(tmp_path / "m.gguf", arch="qwen3moe", **{"qwen3moe.expert_count": 5})
    with pytest.raises(ModelFileError, match=r"blk\.0\.ffn_gate_inp\.weight.*\(4, 64\).*\(5, 64\)"):
        read_config(open_gguf(path))


def test_routing_worked_by_hand():
    be = NumpyBackend()
    logits = np.array([[1.0, 3.0, 2.0, 3.0], [0.0, -1.0, 5.0, 1.0]], dtype=np.float32)
    # Qwen3-MoE: softmax over all four, keep the top 2 (a tie goes to the lower number), renormalise
    choice = be.route(logits, Routing(4, 2, "softmax_top_k", normalize=True))
    np.testing.assert_array_equal(choice[:, :2], [[1, 3], [2, 3]])
    np.testing.assert_allclose(choice[0, 2:], [0.5, 0.5], rtol=1e-6)
    np.testing.assert_allclose(choice[1, 2:], [math.e**5 / (math.e**5 + math.e), math.e / (math.e**5 + math.e)], rtol=1e-6)
    unnormalised = be.route(logits, Routing(4, 2, "softmax_top_k", normalize=False))
    total = sum(math.exp(v) for v in (1, 3, 2, 3))
    np.testing.assert_allclose(unnormalised[0, 2:], [math.e**3 / total] * 2, rtol=1e-6)
    # gpt-oss: the top 2 logits, then a softmax over just those
    oss = be.route(logits, Routing(4, 2, "top_k_softmax"))
    np.testing.assert_allclose(oss[1, 2:], [1 / (1 + math.e**-4), math.e**-4 / (1 + math.e**-4)], rtol=1e-6)


@pytest.mark.parametrize("arch", MOE)
def test_the_mixture_equals_a_textbook_one_in_float64(tmp_path, arch):
    loaded = load_model(write_tiny_model(tmp_path / "m.gguf", arch=arch, n_layers=1), backend="numpy")
    try:
        be, block = loaded.backend, loaded.model.layers[0].feed_forward
        x = np.random.default_rng(3).standard_normal((5, 64)).astype(np.float32)
        choice = be.route(be.linear(x, block.router, block.router_bias), block.routing)
        got = be.experts(x, choice, block.experts, block.activation)  # (5, 64)
        f = loaded.model._file.tensors
        stack = {n: f[f"blk.0.ffn_{n}_exps.weight"].data.view("<f4").reshape(f[f"blk.0.ffn_{n}_exps.weight"].shape)
                 for n in ("gate", "up", "down")}  # F32 file: the values as stored
        bias = {n: f[f"blk.0.ffn_{n}_exps.bias"].data.view("<f4").reshape(f[f"blk.0.ffn_{n}_exps.bias"].shape)
                if f"blk.0.ffn_{n}_exps.bias" in f else None for n in ("gate", "up", "down")}
        expected = np.zeros((5, 64))
        for t in range(5):
            for slot in range(N_EXPERTS_USED):
                e, w = int(choice[t, slot]), float(choice[t, N_EXPERTS_USED + slot])
                g = stack["gate"][e].astype(np.float64) @ x[t] + (0 if bias["gate"] is None else bias["gate"][e])
                u = stack["up"][e].astype(np.float64) @ x[t] + (0 if bias["up"] is None else bias["up"][e])
                if arch == "gpt-oss":
                    g = np.minimum(g, 7.0)
                    h = g / (1 + np.exp(-1.702 * g)) * (np.clip(u, -7, 7) + 1)
                else:
                    h = g / (1 + np.exp(-g)) * u
                y = stack["down"][e].astype(np.float64) @ h + (0 if bias["down"] is None else bias["down"][e])
                expected[t] += w * y
        np.testing.assert_allclose(got, expected, rtol=0, atol=2e-5 * np.abs(expected).max())
    finally:
        loaded.close()


def test_an_expert_no_token_chose_is_never_dequantized(tmp_path):
    path = write_tiny_model(tmp_path / "m.gguf", arch="qwen3moe", n_layers=1, tensor_type=GGMLQuantizationType.Q8_0)
    loaded = load_model(path, backend="numpy")
    try:
        assert not [name for name in loaded.backend.cache._dense if "_exps" in name]  # nothing at load
        be, block = loaded.backend, loaded.model.layers[0].feed_forward
        x = np.random.default_rng(4).standard_normal((1, 64)).astype(np.float32)
        choice = be.route(be.linear(x, block.router), block.routing)
        be.experts(x, choice, block.experts, block.activation)
        chosen = {int(e) for e in choice[0, :N_EXPERTS_USED]}
        read = {int(name.rsplit("[", 1)[1].rstrip("]")) for name in be.cache._dense if "_exps" in name}
        assert read == chosen and len(chosen) < N_EXPERTS
    finally:
        loaded.close()


def test_yarn_matches_transformers_rule_with_rounded_ramp_ends():
    # transformers' _compute_yarn_parameters (truncate=True), written out independently here
    dim, base, factor, original, fast, slow = 64, 150000.0, 32.0, 4096, 32.0, 1.0

    def correction(rotations):
        return (dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = max(math.floor(correction(fast)), 0), min(math.ceil(correction(slow)), dim - 1)
    ramp = np.clip((np.arange(dim // 2) - low) / (high - low), 0, 1)
    extrapolation = 1 - ramp
    pos = base ** (np.arange(0, dim, 2) / dim)
    inv_freq = (1 / (factor * pos)) * (1 - extrapolation) + (1 / pos) * extrapolation
    divisors = yarn_divisors(dim, base, factor, original, fast, slow)
    np.testing.assert_allclose((1 / pos) / divisors, inv_freq, rtol=1e-6)
    assert yarn_mscale(factor) == pytest.approx(0.1 * math.log(32) + 1)


@pytest.mark.parametrize("arch", MOE)
@pytest.mark.parametrize("tensor_type", ["F32", "Q8_0", "Q4_0"])
def test_mlx_matches_numpy(tmp_path, arch, tensor_type):
    if importlib.util.find_spec("mlx") is None:
        pytest.skip("mlx is not installed")
    path = write_tiny_model(tmp_path / "m.gguf", arch=arch, tensor_type=GGMLQuantizationType[tensor_type])
    out = {}
    for backend in ("numpy", "mlx"):
        loaded = load_model(path, backend=backend)
        try:
            cache = loaded.new_cache(64)
            out[backend] = loaded.model.forward(np.arange(5, 40), 0, cache.storage, all_logits=True)  # (35, vocab)
        finally:
            loaded.close()
    spread = np.ptp(out["numpy"])
    np.testing.assert_allclose(out["mlx"], out["numpy"], rtol=0, atol=5e-2 * spread)
    assert np.array_equal(out["mlx"].argmax(axis=1), out["numpy"].argmax(axis=1))
