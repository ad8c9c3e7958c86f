"""Gemma 4 (text) against transformers in float32 (fixtures from tools/fixtures/make_gemma4_fixtures.py:
tiny random Gemma4ForCausalLM models converted and quantized by llama.cpp).

`gemma4` has the E2B/E4B layout (sliding and global layers of different head sizes, keys as
values and proportional RoPE on the global ones, two KV-sharing layers with a wider MLP,
per-layer input embeddings); `gemma4-moe` the 26B-A4B one (an MLP and a mixture of experts in
every layer). NumPy: last-position logits within 1e-3 of the logit range of transformers' on
each file (on the quantized ones, transformers on that file's weights dequantized by gguf-py);
every position of the longest prompt (40 tokens, five times the sliding window of 8); greedy
continuations equal. cpu and MLX: within 5e-2 of the range, the same top token. cpu: recorded
passes and batches equal the ops run one by one, bit for bit. The chat template renders in
Sprig's sandbox as in transformers'.
"""

import numpy as np
import pytest

from backends.base import Routing
from backends.cpu_backend import CpuBackend
from backends.numpy_backend import NumpyBackend
from engine.errors import ModelFileError
from engine.gguf_file import open_gguf
from engine.loader import load_model
from engine.models import read_config
from engine.tokenizer import Tokenizer
from tests.engine import test_dense_families as dense
from tests.engine.test_against_transformers import write_f32_twin
from tests.engine.test_dense_families import FIXTURES, load, prompts, reference

FAMILIES = ["gemma4", "gemma4-moe"]
QUANTS = ["f32", "q8_0", "q4_k_m"]


# The dense families' tests, run on these files.


@pytest.mark.parametrize("quant", QUANTS)
@pytest.mark.parametrize("arch", FAMILIES)
def test_numpy_equals_transformers(arch, quant):
    dense.test_numpy_equals_transformers(arch, quant)


@pytest.mark.parametrize("arch", FAMILIES)
def test_numpy_every_position_beyond_the_window_and_greedy_equal_transformers(arch):
    ref, meta = reference(arch)
    assert meta["hf_config"]["sliding_window"] * 4 < len(ref[f"prompt_{meta['logits_all_prompt']}"])
    dense.test_numpy_every_position_and_greedy_equal_transformers(arch)


@pytest.mark.parametrize("backend", ["cpu", "mlx"])
@pytest.mark.parametrize("quant", QUANTS)
@pytest.mark.parametrize("arch", FAMILIES)
def test_faster_backends_agree(arch, quant, backend):
    dense.test_faster_backends_agree(arch, quant, backend)


@pytest.mark.parametrize("arch", FAMILIES)
def test_the_template_renders_as_transformers_does(arch, monkeypatch):
    dense.test_the_familys_template_renders_as_transformers_does(arch, monkeypatch)


@pytest.mark.parametrize("arch", FAMILIES)
def test_cpu_recorded_passes_and_batches_equal_the_ops_one_by_one(arch):
    dense.test_cpu_recorded_passes_equal_the_ops_one_by_one(arch)


# Gemma 4's own.


@pytest.mark.parametrize("arch", FAMILIES)
def test_cpu_greedy_decoding_equals_numpy(arch):
    ref, _ = reference(arch)
    runs = {}
    for backend in ("numpy", "cpu"):
        loaded = load(arch, "q4_k_m", backend)
        try:
            runs[backend] = []
            for prompt in prompts(ref):
                cache = loaded.new_cache(len(prompt) + 17)
                logits, tokens = cache.feed(loaded.model, list(prompt))[-1], []
                for _ in range(16):  # one-token passes: recorded and replayed on cpu
                    tokens.append(int(np.argmax(logits)))
                    logits = cache.feed(loaded.model, tokens[-1:])[-1]
                runs[backend].append(tokens)
        finally:
            loaded.close()
    assert runs["cpu"] == runs["numpy"]


def test_the_files_per_layer_settings_are_transformers_config():
    _, meta = reference("gemma4")
    hf = meta["hf_config"]
    config = read_config(open_gguf(FIXTURES / "models" / "tiny-gemma4-q8_0.gguf"))
    assert config.sliding == tuple(t == "sliding_attention" for t in hf["layer_types"])
    shapes = [config.layer_config(i) for i in range(config.n_layers)]
    own = [{"head_dim": hf["head_dim"], "num_key_value_heads": hf["num_key_value_heads"],
            **hf["per_layer_config"].get(str(i), {})} for i in range(4)]  # transformers' settings per layer
    assert [c.head_dim for c in shapes] == [o["head_dim"] for o in own] == [32, 64, 32, 64]
    assert [c.n_kv_heads for c in shapes] == [o["num_key_value_heads"] for o in own]
    assert [c.d_ff for c in shapes] == [hf["intermediate_size"]] * 2 + [2 * hf["intermediate_size"]] * 2
    assert [config.kv_source(i) for i in range(4)] == [0, 1, 0, 1]  # the last two reuse the first two's
    rope = hf["rope_parameters"]
    assert (config.rope_base_local, config.rope_base) == (
        rope["sliding_attention"]["rope_theta"],
        rope["full_attention"]["rope_theta"],
    )
    assert config.per_layer_input == hf["hidden_size_per_layer_input"]
    assert config.final_logit_softcap == hf["final_logit_softcapping"]


def test_kv_sharing_layers_hold_their_source_layers_keys_and_values():
    ref, _ = reference("gemma4")
    loaded = load("gemma4", "f32", "numpy")
    try:
        cache = loaded.new_cache(48)
        cache.feed(loaded.model, list(ref["prompt_0"]))
        state = cache.storage
        for shared, source in ((2, 0), (3, 1)):
            np.testing.assert_array_equal(state.keys[shared], state.keys[source])
            np.testing.assert_array_equal(state.values[shared], state.values[source])
        assert np.any(state.keys[0]) and np.any(state.values[1])
    finally:
        loaded.close()


def test_the_tokenizer_is_transformers():
    _, meta = reference("gemma4")
    with open_gguf(FIXTURES / "models" / "tiny-gemma4-q8_0.gguf") as f:
        assert f.metadata["tokenizer.ggml.model"] == "gemma4"
        tokenizer = Tokenizer.from_metadata(f.metadata, "tiny-gemma4")
    for k, prompt in enumerate(meta["prompts"]):  # transformers' ids of each prompt (cut at 40 tokens)
        ids = [int(i) for i in prompt["ids"].split(",")]
        assert tokenizer.encode(prompt["text"], add_bos=False, parse_special=True)[: len(ids)] == ids, f"prompt {k}"
    assert tokenizer.add_bos and tokenizer.token_text(tokenizer.bos_id) == "<bos>"
    assert {tokenizer.token_text(i) for i in tokenizer.stop_ids} >= {"<eos>", "<turn|>"}


@pytest.mark.parametrize("backend_class", [NumpyBackend, CpuBackend])
def test_columns_and_per_expert_routing_scales_by_hand(backend_class):
    be = backend_class()
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    np.testing.assert_array_equal(be.to_host(be.columns(x, 1, 2)), [[1, 2], [5, 6], [9, 10]])
    logits = np.array([[1.0, 3.0, 2.0, 0.0]], dtype=np.float32)
    scale = np.array([10.0, 2.0, 0.5, 7.0], dtype=np.float32)
    choice = be.to_host(be.route(logits, Routing(4, 2, "softmax_top_k", True, scale)))
    p1, p2 = np.exp(3.0), np.exp(2.0)  # experts 1 and 2, their shares renormalised, then scaled
    np.testing.assert_allclose(choice[0], [1, 2, 2.0 * p1 / (p1 + p2), 0.5 * p2 / (p1 + p2)], rtol=1e-6)


def test_a_vision_tower_in_the_file_is_left_unread_with_a_note(tmp_path):
    ref, _ = reference("gemma4-moe")
    path = tmp_path / "with-tower.gguf"
    towers = {"v.patch_embd.weight": np.ones((16, 8), np.float32), "mm.input_proj.weight": np.ones((8, 4), np.float32)}
    write_f32_twin(FIXTURES / "models" / "tiny-gemma4-moe-f32.gguf", path, towers)
    loaded = load_model(path, backend="numpy")
    try:
        assert any("image or audio encoder (2 tensors)" in note for note in loaded.load_notes)
        logits = dense.last_logits(loaded, ref["prompt_0"])
        np.testing.assert_allclose(logits, ref["logits"][0], rtol=0, atol=1e-3 * np.ptp(ref["logits"][0]))
    finally:
        loaded.close()


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"omit": ("blk.1.ffn_gate_up_exps.weight",)}, r"blk\.1\.ffn_gate_up_exps\.weight"),
        ({"metadata": {"gemma4.attention.sliding_window_pattern": [True]}}, "sliding_window_pattern"),
        ({"metadata": {"gemma4.attention.head_count_kv": 3}}, "key/value heads"),
        ({"metadata": {"gemma4.attention.key_length_swa": 48}}, "key and value sizes"),
        (
            {"metadata": {"gemma4.attention.key_length_swa": 48, "gemma4.attention.value_length_swa": 48}},
            r"blk\.0\.attn_q\.weight.*\(64, 256\).*\(96, 256\)",
        ),
    ],
)
def test_a_broken_file_is_refused_naming_what_is_wrong(tmp_path, change, named):
    path = tmp_path / "broken.gguf"
    write_f32_twin(FIXTURES / "models" / "tiny-gemma4-moe-f32.gguf", path, **change)
    with pytest.raises(ModelFileError, match=named):
        read_config(open_gguf(path))
