"""What 8-bit activation codes would cost a type before any kernel is written, for docs/benchmarks.md.

    PYTHONPATH=. .venv/bin/python -m tools.bench.emulate_activation_codes gemma3 Q4_K,Q6_K [--span 32]

Runs a model on the NumPy backend twice: as it is, and with the activations of every product
with a matrix of the listed types rounded first as 8-bit codes would round them (per `span`
values, d = amax / 127, x / d rounded to even, as the cpu kernels' Codes8). It prints what
tests/engine/test_cpu_end_to_end.py holds the cpu backend to against NumPy: the largest logit
error over the logit range after each prompt (the test allows 2e-3), top-1 agreement, how many
32-token greedy continuations stay identical (the test asks 9 of 10) and the perplexity.
"""

import argparse

import numpy as np
from gguf import GGMLQuantizationType

from backends import numpy_backend
from backends.base import Backend
from engine.bundled import resolve_model_path
from engine.loader import load_model
from engine.perplexity import perplexity
from tests.engine.test_cpu_end_to_end import PPL_TEXT, TEXT_PROMPTS
from tools.bench.measure_cpu_accuracy import agreement, prompt_runs


def rounded_as_codes(x: np.ndarray, span: int) -> np.ndarray:
    """x (..., K) as 8-bit codes with one scale per `span` values give it back."""
    groups = x.reshape(-1, x.shape[-1] // span, span).astype(np.float32)  # (rows, K / span, span)
    d = np.abs(groups).max(-1, keepdims=True) / np.float32(127.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        codes = np.where(d > 0, np.round(groups / d), 0.0)
    return (codes * d).astype(np.float32).reshape(x.shape)  # (..., K)


def run(path) -> tuple[list, float]:
    """prompt_runs on the NumPy backend, and the perplexity."""
    model = load_model(path, "numpy", kv_type="f32")
    return prompt_runs(model), perplexity(model, PPL_TEXT, ctx=128, max_windows=4).ppl


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="a bundled model's key or a GGUF path")
    parser.add_argument("types", help="comma-separated GGUF types whose products take 8-bit codes, e.g. Q4_K,Q6_K")
    parser.add_argument("--span", type=int, default=32, help="values per activation scale")
    args = parser.parse_args()
    path = resolve_model_path(args.model)
    types = {int(GGMLQuantizationType[name]) for name in args.types.split(",")}
    reference = run(path)

    exact = numpy_backend.NumpyWeight.matmul_transposed

    def rounded(weight, x):
        return exact(weight, rounded_as_codes(x, args.span) if int(weight.spec.ggml_type) in types else x)

    numpy_backend.NumpyWeight.matmul_transposed = rounded
    numpy_backend.NumpyBackend.fuse_linear = Backend.fuse_linear  # every product through matmul_transposed
    emulated = run(path)

    error, top, same = agreement(emulated[0], reference[0])
    n, ppl, ppl_emulated = len(TEXT_PROMPTS), reference[1], emulated[1]
    print(
        f"{path.name}, {args.types} on 8-bit codes per {args.span}: max logit error / range {error:.2e}, "
        f"top-1 {top}/{n}, greedy-32 identical {same}/{n}, "
        f"perplexity {ppl:.3f} -> {ppl_emulated:.3f} ({ppl_emulated / ppl - 1:+.2%})"
    )


if __name__ == "__main__":
    main()
