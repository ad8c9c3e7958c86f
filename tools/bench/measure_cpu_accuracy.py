"""The native CPU backend's accuracy against the NumPy reference, for docs/benchmarks.md.

    .venv/bin/python -m tools.bench.measure_cpu_accuracy smollm2 gemma3 [path/to/model.gguf ...]

Per model, on the end-to-end tests' 10 prompts (tests/engine/test_cpu_end_to_end.py): the
largest logit error after each prompt as a share of the reference logits' range, how many
top tokens and 32-token greedy continuations are the same, and the perplexity over
tests/fixtures/ppl_text.txt (4 windows of 128 tokens) on both backends: each window fed at
once (prefill products over 32 tokens or more, which take float activations), and on the
cpu backend also 16 tokens at a time (products that quantize the activations).
"""

import argparse

import numpy as np

from engine.bundled import resolve_model_path
from engine.loader import load_model
from engine.perplexity import perplexity
from tests.engine.parity_models import greedy_forward
from tests.engine.test_cpu_end_to_end import N_GREEDY, PPL_TEXT, TEXT_PROMPTS


def prompt_runs(model) -> list[tuple[np.ndarray, list[int]]]:
    """The logits after each of the end-to-end tests' prompts, and its 32-token greedy continuation."""
    prompts = [model.tokenizer.encode(t, add_bos=model.tokenizer.add_bos) for t in TEXT_PROMPTS]
    return [greedy_forward(model, p, N_GREEDY) for p in prompts]


def agreement(ours: list, reference: list) -> tuple[float, int, int]:
    """Of two prompt_runs: the largest logit error as a share of the reference's range, how many
    top tokens and how many greedy continuations are the same."""
    pairs = list(zip(ours, reference, strict=True))
    error = max(float(np.abs(o[0] - r[0]).max() / (r[0].max() - r[0].min())) for o, r in pairs)
    top = sum(int(np.argmax(o[0]) == np.argmax(r[0])) for o, r in pairs)
    same = sum(o[1] == r[1] for o, r in pairs)
    return error, top, same


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+", help="bundled model keys, e.g. smollm2 gemma3")
    args = parser.parse_args()
    print("| Model | max logit error / range | top-1 same | greedy-32 identical | perplexity NumPy → cpu "
          "| cpu, 16 tokens at a time |")
    print("|---|---:|---:|---:|---:|---:|")
    for key in args.models:
        loaded = {name: load_model(resolve_model_path(key), name) for name in ("numpy", "cpu")}
        runs = {name: prompt_runs(model) for name, model in loaded.items()}
        error, top, same = agreement(runs["cpu"], runs["numpy"])
        n = len(TEXT_PROMPTS)
        ppl = {name: perplexity(model, PPL_TEXT, ctx=128, max_windows=4).ppl for name, model in loaded.items()}
        in_steps = perplexity(loaded["cpu"], PPL_TEXT, ctx=128, max_windows=4, chunk=16).ppl
        change, steps_change = (100.0 * (p / ppl["numpy"] - 1.0) for p in (ppl["cpu"], in_steps))
        print(
            f"| {key} | {error:.1e} | {top}/{n} | {same}/{n} | "
            f"{ppl['numpy']:.4f} → {ppl['cpu']:.4f} ({change:+.3f}%) | {in_steps:.4f} ({steps_change:+.3f}%) |"
        )
        for model in loaded.values():
            model.close()


if __name__ == "__main__":
    main()
