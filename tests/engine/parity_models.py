"""Models and helpers shared by the backend parity tests (MLX and native CPU against NumPy)."""

from pathlib import Path

import numpy as np

from backends.base import Runner, Segment
from engine.bundled import bundled_model
from engine.loader import LoadedModel, load_model
from tests.gguf_factory import write_tiny_model

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "models"


def model_path(key: str, tmp_dir: Path) -> Path:
    """The GGUF file of `key`: a bundled model, a fixture, or a tiny model written now."""
    if key in ("smollm2", "gemma3"):
        return bundled_model(key).path
    if key.startswith("tiny-qwen3"):
        return FIXTURES / f"{key}.gguf"
    arch = key.removeprefix("tiny-")
    # Caps small enough to change the tiny model's scores and logits, so that ignoring them shows.
    caps = {"gemma2.attn_logit_softcapping": 2.0, "gemma2.final_logit_softcapping": 3.0} if arch == "gemma2" else {}
    return write_tiny_model(tmp_dir / f"{key}.gguf", arch=arch, seed=11, **caps)


def load_on_both(request, key: str, tmp_dir: Path, backend: str) -> dict[str, LoadedModel]:
    """Model `key` loaded on NumPy and on `backend`, closed when the test's fixture ends.

    Their KV caches are float32: a float16 or Q8_0 cache rounds each backend's keys, which
    differ in their last float32 bits, and a key on either side of a rounding boundary moves
    by a whole float16 step (5e-5 of the logits' span measured on tiny Gemma). That the
    backends store the same rounding is tested in tests/backends/test_kv_types.py."""
    path = model_path(key, tmp_dir)
    loaded = {name: load_model(path, name, kv_type="f32") for name in ("numpy", backend)}
    for model in loaded.values():
        request.addfinalizer(model.close)
    return loaded


def greedy_forward(loaded: LoadedModel, prompt: list[int], n: int) -> tuple[np.ndarray, list[int]]:
    """Prefill `prompt`, then take the argmax `n` times through `forward`: (prompt logits, tokens)."""
    cache = loaded.new_cache(len(prompt) + n)
    logits = loaded.model.forward(np.asarray(prompt), 0, cache.storage)[-1]
    prompt_logits, tokens = logits, []
    for step in range(n):
        tokens.append(int(np.argmax(logits)))
        if step < n - 1:
            logits = loaded.model.forward(np.asarray(tokens[-1:]), len(prompt) + step, cache.storage)[-1]
    return prompt_logits, tokens


def op_by_op(model, tokens, segments: list[Segment]):
    """Every row's logits of `tokens` on `segments`, the ops run one by one whatever runner the
    backend has (the base `Runner`): the reference a recorded or compiled pass must equal."""
    return Runner(model.logits)(tokens, segments, all_logits=True)
