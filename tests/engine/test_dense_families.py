"""The dense families of issue 25 against transformers in float32 (fixtures from
tools/fixtures/make_dense_fixtures.py: tiny random models converted and quantized by llama.cpp).

NumPy: last-position logits within 1e-3 of the logit range of transformers' on the F32 file,
and on each quantized file against transformers on that file's weights (dequantized by
gguf-py); every position of the longest prompt (longer than each sliding window); greedy
continuations equal. cpu and MLX: within 5e-2 of the range, the same top token. Each
family's chat template, rendered in Sprig's sandbox, equals transformers' rendering.
"""

import datetime
import importlib.util
import json
import re
from pathlib import Path

import numpy as np
import pytest

from engine import chat_template
from engine.chat_template import ChatTemplate
from backends.base import Segment
from engine.loader import load_model
from tests.engine.parity_models import op_by_op

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
FAMILIES = ["phi3", "gemma", "command-r", "cohere2", "starcoder2", "olmo2", "granite", "smollm3"]
QUANTS = ["f32", "q8_0", "q4_k_m"]


def reference(arch: str) -> tuple[dict[str, np.ndarray], dict]:
    name = f"tiny-{arch}"
    with np.load(FIXTURES / "reference" / f"{name}.npz") as z:
        arrays = {k: z[k] for k in z.files}
    return arrays, json.loads((FIXTURES / "reference" / f"{name}.json").read_text())


def prompts(ref: dict) -> list[np.ndarray]:
    return [ref[k] for k in sorted(k for k in ref if k.startswith("prompt_"))]


def load(arch: str, quant: str, backend: str):
    # a float32 KV cache, as transformers keeps its keys and values: a float16 cache moves these
    # tiny models' logits by up to about 1e-3 of their range (its own bounds: tests/backends/test_kv_types.py),
    # and by how much depends on which way the machine's last bits round each key
    return load_model(FIXTURES / "models" / f"tiny-{arch}-{quant}.gguf", backend=backend, kv_type="f32")


def last_logits(loaded, prompt) -> np.ndarray:
    """The logits after `prompt`, in a context of the prompt's length (LongRoPE chooses by it)."""
    return loaded.model.forward(prompt, 0, loaded.new_cache(len(prompt)).storage)[-1]


@pytest.mark.parametrize("quant", QUANTS)
@pytest.mark.parametrize("arch", FAMILIES)
def test_numpy_equals_transformers(arch, quant):
    ref, _ = reference(arch)
    want = ref["logits"] if quant == "f32" else ref[f"{quant}_logits"]
    loaded = load(arch, quant, "numpy")
    try:
        for k, prompt in enumerate(prompts(ref)):
            got = last_logits(loaded, prompt)
            np.testing.assert_allclose(got, want[k], rtol=0, atol=1e-3 * np.ptp(want[k]), err_msg=f"prompt {k}")
    finally:
        loaded.close()


@pytest.mark.parametrize("arch", FAMILIES)
def test_numpy_every_position_and_greedy_equal_transformers(arch):
    ref, meta = reference(arch)
    loaded = load(arch, "f32", "numpy")
    try:
        k = meta["logits_all_prompt"]
        prompt = ref[f"prompt_{k}"]
        every = loaded.model.forward(prompt, 0, loaded.new_cache(len(prompt)).storage, all_logits=True)
        want = ref[f"logits_all_{k}"]
        np.testing.assert_allclose(every, want, rtol=0, atol=1e-3 * np.ptp(want))
        # Phi-3's LongRoPE: transformers picks the factors by each step's length, so its greedy
        # run switches to the long ones mid-answer where the prompt is short; llama.cpp and
        # Sprig pick once, by the context. Those runs are not compared (the reference says which).
        switched = meta.get("greedy_rope_factors_switch", [0] * len(ref["greedy"]))
        for k, prompt in enumerate(prompts(ref)):
            if switched[k]:
                continue
            cache = loaded.new_cache(len(prompt) + 32)
            logits, tokens = cache.feed(loaded.model, list(prompt))[-1], []
            for _ in range(32):
                tokens.append(int(np.argmax(logits)))
                logits = cache.feed(loaded.model, tokens[-1:])[-1]
            assert tokens == list(ref["greedy"][k]), f"prompt {k}"
    finally:
        loaded.close()


@pytest.mark.parametrize("backend", ["cpu", "mlx"])
@pytest.mark.parametrize("quant", QUANTS)
@pytest.mark.parametrize("arch", FAMILIES)
def test_faster_backends_agree(arch, quant, backend):
    if backend == "mlx" and importlib.util.find_spec("mlx") is None:
        pytest.skip("mlx is not installed")
    ref, _ = reference(arch)
    want = ref["logits"] if quant == "f32" else ref[f"{quant}_logits"]
    loaded = load(arch, quant, backend)
    try:
        for k, prompt in enumerate(prompts(ref)):
            got = last_logits(loaded, prompt)
            np.testing.assert_allclose(got, want[k], rtol=0, atol=5e-2 * np.ptp(want[k]), err_msg=f"prompt {k}")
            assert int(np.argmax(got)) == int(np.argmax(want[k])), f"prompt {k}"
    finally:
        loaded.close()


@pytest.mark.parametrize("arch", FAMILIES)
def test_the_familys_template_renders_as_transformers_does(arch, monkeypatch):
    _, meta = reference(arch)
    # the reference rendered with these special tokens and with the date fixed (chat_render says so)
    tokens = dict(re.findall(r"(bos_token|eos_token)='([^']*)'", meta["chat_render"]))
    monkeypatch.setattr(chat_template, "_strftime_now", lambda fmt: datetime.date(2025, 6, 26).strftime(fmt))
    template = ChatTemplate(meta["chat_template"], **tokens)
    rendered = template.render(meta["chat_messages"], add_generation_prompt=True)
    assert rendered == meta["chat_rendered"]


@pytest.mark.parametrize("arch", FAMILIES)
def test_cpu_recorded_passes_equal_the_ops_one_by_one(arch):
    ref, _ = reference(arch)
    loaded = load(arch, "q8_0", "cpu")
    try:
        prompt = [int(t) for t in max(prompts(ref), key=len)]
        recorded, eager = loaded.new_cache(64), loaded.new_cache(64)
        for cache in (recorded, eager):
            cache.feed(loaded.model, prompt[:20])
        check = loaded.model.forward(np.asarray(prompt[20:24]), 20, recorded.storage, all_logits=True)  # a draft's check
        np.testing.assert_array_equal(check, op_by_op(loaded.model, prompt[20:24], [Segment(eager.storage, 20, 4)]))
        batch = loaded.model.decode_batch(np.array([7, 9]), np.array([24, 24]), [recorded.storage, eager.storage])
        alone = op_by_op(loaded.model, [7], [Segment(recorded.storage, 24, 1)])
        np.testing.assert_array_equal(batch[:1], alone)  # a batch row is the sequence alone
    finally:
        loaded.close()
