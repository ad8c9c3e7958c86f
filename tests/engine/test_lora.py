"""LoRA adapters at run time against PEFT (tools/fixtures/make_lora_embedding_fixtures.py): a tiny
random Qwen3 base and two random PEFT adapters, all converted by llama.cpp's scripts, on
NumPy, cpu and MLX (where mlx is installed: its compiled one-token step carries them too)."""

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from engine import cli
from engine.generation import generate
from engine.loader import load_model
from engine.models.lora import AdapterError, parse_lora_option, read_adapter
from engine.sampling import SamplingParams

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
MODELS = FIXTURES / "models"
BASE = MODELS / "tiny-lora-base-f32.gguf"
REFERENCE = np.load(FIXTURES / "reference" / "tiny-lora.npz")
TOLERANCE = {"numpy": 1e-3, "cpu": 5e-2, "mlx": 5e-2}  # of the reference's logit range


@pytest.fixture(scope="module", params=["numpy", "cpu", "mlx"])
def loaded(request):
    if request.param == "mlx":
        pytest.importorskip("mlx.core", reason="mlx is not installed (pip install 'sprig[mlx]')")
    loaded = load_model(BASE, request.param, kv_type="f32")  # as the float32 reference keeps its keys
    yield loaded
    loaded.close()


@pytest.fixture(scope="module")
def adapters():
    return read_adapter(MODELS / "tiny-lora-a.gguf"), read_adapter(MODELS / "tiny-lora-b.gguf")


def all_logits(loaded, k):
    cache = loaded.new_cache(64)
    return loaded.model.forward(REFERENCE[f"prompt_{k}"], 0, cache.storage, all_logits=True)


def last_by_steps(loaded, k):
    """The last position's logits as plain decoding gets them: a prefill, then one-token
    steps (the passes the cpu backend records and replays)."""
    prompt = REFERENCE[f"prompt_{k}"]
    cache = loaded.new_cache(64)
    cache.feed(loaded.model, prompt[:-3])
    step = loaded.model.decode_step(cache.storage)
    for i, token in enumerate(prompt[-3:]):
        logits = loaded.backend.to_host(step(int(token), len(prompt) - 3 + i))
    return logits[-1]


def assert_close(got, want, backend):
    spread = float(want.max() - want.min())
    assert float(np.abs(got - want).max()) <= TOLERANCE[backend] * spread


def test_logits_match_peft(loaded, adapters):
    backend = loaded.backend.name
    stack = loaded.model.adapters
    a, b = adapters
    try:
        for k in range(2):
            assert_close(all_logits(loaded, k), REFERENCE[f"base_{k}"], backend)
        stack.push(a)
        for k in range(2):
            assert_close(all_logits(loaded, k), REFERENCE[f"a_{k}"], backend)
            assert_close(last_by_steps(loaded, k), REFERENCE[f"a_{k}"][-1], backend)
        # the adapter matters: its logits are far from the base's
        assert np.abs(REFERENCE["a_0"] - REFERENCE["base_0"]).max() > 0.2 * np.ptp(REFERENCE["base_0"])
        stack.set_scale(0, 0.5)
        stack.push(b, 2.0)
        for k in range(2):
            assert_close(all_logits(loaded, k), REFERENCE[f"ab_{k}"], backend)
            assert_close(last_by_steps(loaded, k), REFERENCE[f"ab_{k}"][-1], backend)
    finally:
        stack.clear()


def test_push_and_pop_return_the_base_logits_bit_for_bit(loaded, adapters):
    stack = loaded.model.adapters
    before_all, before_steps = all_logits(loaded, 0), last_by_steps(loaded, 0)  # records the cpu passes
    stack.push(adapters[0], 0.7)
    assert not np.allclose(last_by_steps(loaded, 0), before_steps, atol=1e-2)  # never the stale recording
    stack.push(adapters[1])
    stack.pop()
    stack.pop()
    assert np.array_equal(all_logits(loaded, 0), before_all)
    assert np.array_equal(last_by_steps(loaded, 0), before_steps)


def test_a_cache_never_reuses_keys_of_other_adapters(loaded, adapters):
    stack = loaded.model.adapters
    prompt = REFERENCE["prompt_0"].tolist()
    cache = loaded.new_cache(64)
    params = SamplingParams.greedy()
    plain = [e.token for e in generate(loaded.model, loaded.tokenizer, cache, prompt, params, max_tokens=6)]
    try:
        stack.push(adapters[0])
        assert cache.common_prefix(prompt) == 0  # computed under no adapter: forgotten
        adapted = [e.token for e in generate(loaded.model, loaded.tokenizer, cache, prompt, params, max_tokens=6)]
        fresh = [e.token for e in generate(loaded.model, loaded.tokenizer, loaded.new_cache(64), prompt, params,
                                           max_tokens=6)]
        assert adapted == fresh and adapted != plain
    finally:
        stack.clear()


def test_batched_steps_carry_the_adapters(adapters):
    loaded = load_model(BASE, "cpu")
    try:
        loaded.model.adapters.push(adapters[0])
        prompts = [REFERENCE["prompt_0"][:6], REFERENCE["prompt_1"][:4]]
        caches = [loaded.new_cache(64) for _ in prompts]
        for cache, prompt in zip(caches, prompts, strict=True):
            cache.feed(loaded.model, prompt)
        tokens, positions = np.array([5, 9]), np.array([len(p) for p in prompts])
        batch = loaded.backend.to_host(loaded.model.decode_batch(tokens, positions, [c.storage for c in caches]))
        for row, (token, prompt) in enumerate(zip(tokens, prompts, strict=True)):
            alone = loaded.new_cache(64)
            want = alone.feed(loaded.model, [*prompt.tolist(), int(token)])[-1]
            assert np.abs(batch[row] - want).max() <= 1e-3 * np.ptp(want)
    finally:
        loaded.close()


def test_an_adapter_for_another_base_is_refused(adapters):
    loaded = load_model(BASE, "numpy")
    try:
        stack = loaded.model.adapters
        with pytest.raises(AdapterError, match="another base model"):
            stack.push(read_adapter(MODELS / "tiny-lora-other.gguf"))
        with pytest.raises(AdapterError, match="made for 'Llama 3 8B'"):
            stack.push(dataclasses.replace(adapters[0], base_model="Llama 3 8B"))
        with pytest.raises(AdapterError, match="'llama' model"):
            stack.push(dataclasses.replace(adapters[0], architecture="llama"))
        with pytest.raises(AdapterError, match="not a LoRA adapter"):
            read_adapter(BASE)
        assert stack.active == []
    finally:
        loaded.close()


def test_lora_option():
    assert parse_lora_option("a.gguf") == ("a.gguf", 1.0)
    assert parse_lora_option("a.gguf:0.5") == ("a.gguf", 0.5)
    assert parse_lora_option("C:/x/a.gguf:2") == ("C:/x/a.gguf", 2.0)


def test_generate_command_takes_lora(capsys):
    tokens = ",".join(str(t) for t in REFERENCE["prompt_0"])

    def run(*extra):
        assert cli.main(["generate", "--model", str(BASE), "--backend", "numpy", "--tokens", tokens,
                         "--max-tokens", "1", "--speculative", "off", "--json", *extra]) == 0
        return json.loads(capsys.readouterr().out)

    plain, adapted = run(), run("--lora", str(MODELS / "tiny-lora-a.gguf") + ":1")
    assert plain != adapted
    assert cli.main(["generate", "--model", str(BASE), "--backend", "numpy", "--tokens", tokens, "--max-tokens",
                     "1", "--lora", str(MODELS / "tiny-lora-other.gguf")]) == 2
    assert "another base model" in capsys.readouterr().err


@pytest.mark.parametrize("backend", ["numpy", "cpu"])
def test_an_adapter_on_phi3s_fused_tensors_matches_peft(backend):
    """PEFT's adapter on Phi-3's qkv_proj and gate_up_proj (fused tensors that Sprig cuts at
    load) reaches each part with its own rows of B."""
    reference = np.load(FIXTURES / "reference" / "tiny-lora-phi3.npz")
    loaded = load_model(MODELS / "tiny-phi3-f32.gguf", backend, kv_type="f32")  # as the float32 reference
    try:
        adapter = read_adapter(MODELS / "tiny-lora-phi3.gguf")
        assert {"blk.0.attn_qkv.weight", "blk.0.ffn_up.weight"} <= set(adapter.factors)
        loaded.model.adapters.push(adapter)
        for k in range(2):
            cache = loaded.new_cache(32)  # within the original context: LongRoPE's short factors, as transformers
            got = loaded.model.forward(reference[f"prompt_{k}"], 0, cache.storage, all_logits=True)
            assert_close(got, reference[f"lora_{k}"], backend)
        assert np.abs(reference["lora_0"] - reference["base_0"]).max() > 0.2 * np.ptp(reference["base_0"])
    finally:
        loaded.close()
