"""Prefill and decode speed of a loaded model, measured after a warm-up.

Prompt tokens are drawn from the vocabulary with a fixed seed; decoding is greedy and
ignores end-of-generation tokens, so every run does the same amount of work. Both phases
run through `generate`, the loop the app and the CLI use (with the backend's pipelined
decode steps and the detokenizer), so the figures are what a user gets.

A decode step over a deep context costs the same whatever the keys and values are, so
`fill="random"` puts the prompt in the KV cache with random keys and values (rounded to the
cache's type) instead of prefilling it: decode speed and memory at 8k or 32k tokens of
context, on a machine where prefilling them would take too long. Its prefill figure is then
that of the last prompt token alone, and is left out.
"""

from collections.abc import Sequence

import numpy as np

from backends.kv_types import encode_rows
from engine.errors import ContextFullError
from engine.generation import Metrics, generate
from engine.kv_cache import KVCache
from engine.loader import LoadedModel
from engine.sampling import SamplingParams
from engine.speculation import Speculation


def bench(
    loaded: LoadedModel,
    prompt_tokens: int = 256,
    gen_tokens: int = 128,
    repeats: int = 1,
    speculation: Speculation | None = None,
    fill: str = "prefill",
) -> dict:
    """Time a prefill of `prompt_tokens` and `gen_tokens` decode steps; best of `repeats`.
    With `fill` "random", the prompt is held with random keys and values instead (see above).

    With `speculation`, the tokens come from speculative decoding (a random prompt gives
    prompt lookup little to copy: the figure shows what drafting costs where it misses).
    """
    rng = np.random.default_rng(0)
    prompt = rng.integers(0, loaded.config.vocab_size, size=prompt_tokens).tolist()
    cache = loaded.new_cache(prompt_tokens + gen_tokens + 1)
    if cache.n_ctx < prompt_tokens + gen_tokens + 1:
        raise ContextFullError(
            f"{prompt_tokens} prompt tokens and {gen_tokens} steps need a context of {prompt_tokens + gen_tokens + 1} "
            f"tokens, and {loaded.path.name} was trained for {cache.n_ctx}"
        )

    if fill not in ("prefill", "random"):
        raise ValueError(f"fill is 'prefill' or 'random', not {fill!r}")

    def run_once(n_prompt: int, n_gen: int) -> tuple[float, float, Metrics]:
        cache.truncate(0)
        if fill == "random":
            fill_at_random(cache, prompt[: n_prompt - 1])
        # n_gen + 1 tokens: the first comes from the prefill's logits, each of the others
        # from one decode step, so decode_seconds covers n_gen steps.
        *_, last = generate(
            loaded.model,
            loaded.tokenizer,
            cache,
            prompt[:n_prompt],
            SamplingParams.greedy(),
            max_tokens=n_gen + 1,
            ignore_stop_tokens=True,
            speculation=speculation,
        )
        return last.metrics.prefill_seconds, last.metrics.decode_seconds, last.metrics

    run_once(min(32, prompt_tokens), 4)  # warm-up: fills the dequantization cache
    timings = [run_once(prompt_tokens, gen_tokens) for _ in range(repeats)]
    prefill_s = min(t[0] for t in timings)
    decode_s = min(t[1] for t in timings)
    metrics = timings[-1][2]
    return {
        "model": loaded.path.name,
        "backend": loaded.backend.name,
        "device": loaded.backend.device_name,
        "kv_type": loaded.model.kv_type,
        "kv_bytes": cache.memory_bytes(),
        "fill": fill,
        "prompt_tokens": prompt_tokens,
        "gen_tokens": gen_tokens,
        "prefill_tok_s": prompt_tokens / prefill_s if fill == "prefill" else None,
        "decode_tok_s": gen_tokens / decode_s,
        "prefill_s": prefill_s,
        "decode_s": decode_s,
        "speculative": speculation.mode if speculation is not None and speculation.enabled else "off",
        "acceptance_rate": metrics.acceptance_rate,
        "mean_accepted_length": metrics.mean_accepted_length,
    }


def fill_at_random(cache: KVCache, tokens: Sequence[int]) -> None:
    """Hold `tokens` in `cache` with random keys and values (normal, rounded to each layer's
    KV type) in place of their forward pass; recurrent layers stay at zero. Only for states
    whose arrays are host memory (numpy, cpu); ValueError otherwise."""
    storage = cache.storage
    if not hasattr(storage, "keys") or not hasattr(storage, "values"):
        raise ValueError(f"the {cache.backend.name} backend's KV cache cannot be filled at random: prefill it")
    rng = np.random.default_rng(0)
    made: dict[tuple, np.ndarray] = {}  # one random block per layout, shared by the layers alike in it
    for layer, keys, values in zip(storage.layers, storage.keys, storage.values, strict=True):
        if keys is None or values is None:
            continue
        rows = min(len(tokens), keys.shape[1])
        for array, dim in ((keys, layer.head_dim), (values, layer.value_dim)):
            key = (layer.kv_type, layer.kv_heads, rows, dim)
            if key not in made:
                block = rng.standard_normal((layer.kv_heads, rows, dim), dtype=np.float32)  # (Hkv, rows, dim)
                made[key] = encode_rows(layer.kv_type, block)
            array[:, :rows] = made[key]
    cache.append(tokens)
