"""The native CPU backend's accuracy against the NumPy reference, for docs/benchmarks.md.

    .venv/bin/python -m tools.measure_cpu_accuracy smollm2 gemma3 [path/to/model.gguf ...]

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+", help="bundled model keys, e.g. smollm2 gemma3")
    args = parser.parse_args()
    print("| Model | max logit error / range | top-1 same | greedy-32 identical | perplexity NumPy → cpu "
          "| cpu, 16 tokens at a time |")
    print("|---|---:|---:|---:|---:|---:|")
    for key in args.models:
        loaded = {name: load_model(resolve_model_path(key), name) for name in ("numpy", "cpu")}
        prompts = [loaded["numpy"].tokenizer.encode(t, add_bos=loaded["numpy"].tokenizer.add_bos) for t in TEXT_PROMPTS]
        runs = {name: [greedy_forward(model, p, N_GREEDY) for p in prompts] for name, model in loaded.items()}
        errors = [
            float(np.abs(ours[0] - ref[0]).max() / (ref[0].max() - ref[0].min()))
            for ours, ref in zip(runs["cpu"], runs["numpy"], strict=True)
        ]
        top = sum(int(np.argmax(o[0]) == np.argmax(r[0])) for o, r in zip(runs["cpu"], runs["numpy"], strict=True))
        same = sum(o[1] == r[1] for o, r in zip(runs["cpu"], runs["numpy"], strict=True))
        ppl = {name: perplexity(model, PPL_TEXT, ctx=128, max_windows=4).ppl for name, model in loaded.items()}
        in_steps = perplexity(loaded["cpu"], PPL_TEXT, ctx=128, max_windows=4, chunk=16).ppl
        change, steps_change = (100.0 * (p / ppl["numpy"] - 1.0) for p in (ppl["cpu"], in_steps))
        print(
            f"| {key} | {max(errors):.1e} | {top}/{len(prompts)} | {same}/{len(prompts)} | "
            f"{ppl['numpy']:.4f} → {ppl['cpu']:.4f} ({change:+.3f}%) | {in_steps:.4f} ({steps_change:+.3f}%) |"
        )
        for model in loaded.values():
            model.close()


if __name__ == "__main__":
    main()
