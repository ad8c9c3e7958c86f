"""Prefill and decode speed of a loaded model, measured after a warm-up.

Prompt tokens are drawn from the vocabulary with a fixed seed; decoding is greedy and
ignores end-of-generation tokens, so every run does the same amount of work. Both phases
run through `generate`, the loop the app and the CLI use (with the backend's pipelined
decode steps and the detokenizer), so the figures are what a user gets.
"""

import numpy as np

from engine.generation import Metrics, generate
from engine.loader import LoadedModel
from engine.sampling import SamplingParams
from engine.speculation import Speculation


def bench(
    loaded: LoadedModel,
    prompt_tokens: int = 256,
    gen_tokens: int = 128,
    repeats: int = 1,
    speculation: Speculation | None = None,
) -> dict:
    """Time a prefill of `prompt_tokens` and `gen_tokens` decode steps; best of `repeats`.

    With `speculation`, the tokens come from speculative decoding (a random prompt gives
    prompt lookup little to copy: the figure shows what drafting costs where it misses).
    """
    rng = np.random.default_rng(0)
    prompt = rng.integers(0, loaded.config.vocab_size, size=prompt_tokens).tolist()
    cache = loaded.new_cache(prompt_tokens + gen_tokens + 1)

    def run_once(n_prompt: int, n_gen: int) -> tuple[float, float, Metrics]:
        cache.truncate(0)
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
        "prompt_tokens": prompt_tokens,
        "gen_tokens": gen_tokens,
        "prefill_tok_s": prompt_tokens / prefill_s,
        "decode_tok_s": gen_tokens / decode_s,
        "prefill_s": prefill_s,
        "decode_s": decode_s,
        "speculative": speculation.mode if speculation is not None else "off",
        "acceptance_rate": metrics.acceptance_rate,
        "mean_accepted_length": metrics.mean_accepted_length,
    }
