"""The KV type as a setting: a model's caches store it, its logits stay within the bound its
rounding gives, the fit estimate counts its bytes, and the CLI takes it by `--kv-type`.

The logits bound. Storing a value rounds it by at most u of itself (float16, u = 2^-11) or of
its block's largest magnitude (Q8_0, u = 1/254 + 2^-11; see tests/backends/test_kv_types.py).
One attention output then moves by at most (1 + 2 scale |q|_1 max|k|) u max|v| (the op's
bound, tested there); in the tiny model below (unit-scale activations, head_dim 32, scale
1/sqrt(32)) that factor stays under 8, and each later layer passes an error on with a gain
of about 1 (a residual stream with small random weights). So each of the n_layers layers
adds at most 8 u of the output's scale: |logits - logits_f32| <= 8 n_layers u max|logits_f32|.
Measured: 0.95 u (f16) and 3.3 u (Q8_0) of max|logits|, against the bound's 16 u.
"""

import numpy as np
import pytest

from backends.kv_types import kv_row_bytes
from backends.memory import MAPPED_WEIGHTS, RUNTIME_OVERHEAD, Footprint
from engine.bench import bench
from engine.cli import build_parser, main
from engine.loader import load_model
from tests.gguf_factory import write_tiny_model

N_LAYERS = 2
ROUNDING = {"f16": 2.0**-11, "q8_0": 1 / 254 + 2.0**-11}


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    return write_tiny_model(
        tmp_path_factory.mktemp("kv") / "t.gguf", n_layers=N_LAYERS, d_model=128, n_heads=4, n_kv_heads=2, head_dim=32
    )


def logits_with(path, backend: str, kv_type: str) -> tuple[np.ndarray, list[str], object]:
    loaded = load_model(path, backend=backend, kv_type=kv_type)
    try:
        cache = loaded.new_cache(64)
        tokens = np.random.default_rng(0).integers(0, 288, 60)
        return cache.feed(loaded.model, tokens, all_logits=True), loaded.load_notes, cache.storage.keys[0].dtype
    finally:
        loaded.close()


@pytest.mark.parametrize("backend", ["numpy", "cpu"])
def test_logits_with_each_kv_type_are_within_the_rounding_bound_of_float32(tiny_path, backend):
    reference, _, dtype = logits_with(tiny_path, backend, "f32")
    assert dtype == np.float32
    errors = {}
    for kv_type, u in ROUNDING.items():
        logits, notes, dtype = logits_with(tiny_path, backend, kv_type)
        assert notes == []
        assert dtype == (np.float16 if kv_type == "f16" else np.dtype([("d", "<f2"), ("qs", "i1", (32,))]))
        errors[kv_type] = np.abs(logits - reference).max()
        assert errors[kv_type] <= 8 * N_LAYERS * u * np.abs(reference).max(), kv_type
    assert 0 < errors["f16"] < errors["q8_0"]  # each rounds, Q8_0 more coarsely


def test_q8_0_on_heads_that_are_not_whole_blocks_keeps_float16_and_says_so(tmp_path):
    path = write_tiny_model(tmp_path / "h16.gguf", head_dim=16)  # heads of 16 values
    loaded = load_model(path, backend="numpy", kv_type="q8_0")
    try:
        assert loaded.load_notes == ["heads of 16 values do not split into Q8_0 blocks of 32: the KV cache is float16"]
        assert loaded.new_cache(8).storage.keys[0].dtype == np.float16
    finally:
        loaded.close()


def test_an_unknown_kv_type_is_refused_at_load(tiny_path):
    with pytest.raises(ValueError, match="unknown KV type 'q4_0': choose one of f16, q8_0, f32"):
        load_model(tiny_path, backend="numpy", kv_type="q4_0")


def test_the_fit_estimate_counts_the_chosen_types_bytes():
    """Qwen3-8B's shape: 36 layers, 8 KV heads of 128 keys and 128 values, at 32768 positions."""
    per_position_f32 = 4 * 36 * 8 * (128 + 128)  # 294,912 bytes
    expected = {
        "f32": 294_912 * 32768,  # 9.66 GB
        "f16": 2 * 36 * 8 * 256 * 32768,  # 147,456 bytes a position: 4.83 GB
        "q8_0": 36 * 8 * 2 * (128 // 32 * 34) * 32768,  # 78,336 bytes a position: 2.57 GB
    }
    for kv_type, kv_bytes in expected.items():
        model = Footprint(5_000_000_000, 0, per_position_f32, 40960, kv_type)
        assert model.kv_bytes(32768) == kv_bytes
        assert MAPPED_WEIGHTS.needed(model, 32768) == 5_000_000_000 + kv_bytes + RUNTIME_OVERHEAD
    assert expected["q8_0"] == 36 * 2 * kv_row_bytes("q8_0", 128) * 8 * 32768
    assert Footprint(1, 0, per_position_f32, 40960).kv_bytes(32768) == expected["f16"]  # the default
    tight = 5_000_000_000 + RUNTIME_OVERHEAD + expected["q8_0"]  # fits Q8_0, not float16
    assert MAPPED_WEIGHTS.plan(Footprint(5_000_000_000, 0, per_position_f32, 40960, "q8_0"), 32768, tight).fits
    assert not MAPPED_WEIGHTS.plan(Footprint(5_000_000_000, 0, per_position_f32, 40960, "f16"), 32768, tight).fits


@pytest.mark.parametrize("command", ["generate", "chat", "serve", "bench"])
def test_the_cli_takes_a_kv_type(command):
    parser = build_parser()
    extra = ["--prompt", "hi"] if command == "generate" else []
    assert parser.parse_args([command, "--model", "smollm2", "--kv-type", "q8_0", *extra]).kv_type == "q8_0"
    assert parser.parse_args([command, "--model", "smollm2", *extra]).kv_type == "f16"


def test_the_cli_refuses_an_unknown_kv_type_clearly(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "--model", "smollm2", "--kv-type", "q4"])
    assert exit_info.value.code == 2
    assert "argument --kv-type: invalid choice: 'q4' (choose from 'f16', 'q8_0', 'f32')" in capsys.readouterr().err


def test_bench_decodes_after_a_context_filled_at_random(tiny_path):
    """`engine bench --fill random`: the prompt's positions hold random keys and values in the
    cache's type (no prefill is timed), then decoding runs on from there."""
    figures = {}
    for kv_type in ("f32", "f16", "q8_0"):
        loaded = load_model(tiny_path, backend="cpu", kv_type=kv_type)
        try:
            figures[kv_type] = bench(loaded, prompt_tokens=48, gen_tokens=3, fill="random")
        finally:
            loaded.close()
    assert all(f["prefill_tok_s"] is None and f["decode_tok_s"] > 0 for f in figures.values())
    assert [f["kv_type"] for f in figures.values()] == ["f32", "f16", "q8_0"]
    # 4 arrays (2 layers' keys and values) of 2 heads x (48 + 3 + 1) positions x 32 values: 13,312
    # bytes in float32, 6,656 in float16, 3,536 in Q8_0 (34 bytes a block), each rounded up to
    # whole 64-byte cache lines in the cpu backend's arena (Q8_0's: 3,584)
    assert [f["kv_bytes"] for f in figures.values()] == [4 * 13_312, 4 * 6_656, 4 * 3_584]
    with pytest.raises(ValueError, match="fill is 'prefill' or 'random'"):
        bench(load_model(tiny_path, backend="numpy"), prompt_tokens=8, gen_tokens=1, fill="zeros")
