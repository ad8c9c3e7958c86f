"""An importance matrix for llama.cpp's quantizer, measured with Sprig's NumPy reference engine.

Run from the repository root with the app's venv:

    .venv/bin/python -m tools.make_imatrix --model smollm2 --out /tmp/smollm2.imatrix.npz

llama.cpp's IQ1/IQ2/IQ3_XXS quantizers need, for every weight matrix, the mean square of
each input column over some text: the "importance" of each column (what `llama-imatrix`
collects). This runs the model in float32 on NumPy over windows of a text
(tests/fixtures/ppl_text.txt by default) and records, for every 2-D weight the model
multiplies, the mean of x**2 per input column over all the tokens it saw. The .npz file maps
each tensor name (blk.0.attn_q.weight, ...) to a float32 vector of its input size;
tools/requantize.py hands it to llama_model_quantize as its `imatrix` array.
"""

import argparse
from pathlib import Path

import numpy as np

from backends.numpy_backend import NumpyBackend, NumpyWeight
from engine.bundled import resolve_model_path
from engine.gguf_file import open_gguf
from engine.kv_cache import KVCache
from engine.models import build_model, read_config
from engine.tokenizer import Tokenizer

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_TEXT = ROOT / "tests" / "fixtures" / "ppl_text.txt"


class RecordingBackend(NumpyBackend):
    """The NumPy backend, matrices kept apart, summing x**2 per input column of every product."""

    def __init__(self) -> None:
        super().__init__()
        self.sums: dict[str, np.ndarray] = {}
        self.counts: dict[str, int] = {}

    def fuse_linear(self, weights: list[NumpyWeight]) -> tuple:
        """Apart, so that each product is seen with its own weight's name."""
        return tuple(weights)

    def linear(self, x: np.ndarray, weight: NumpyWeight, bias: np.ndarray | None = None) -> np.ndarray:
        name = weight.spec.name
        rows = x.reshape(-1, x.shape[-1]).astype(np.float64)  # (T, in)
        self.sums[name] = self.sums.get(name, 0.0) + (rows**2).sum(axis=0)
        self.counts[name] = self.counts.get(name, 0) + rows.shape[0]
        return super().linear(x, weight, bias)


def importance_matrix(model_path: str | Path, text: str, ctx: int = 128, max_windows: int = 4) -> dict[str, np.ndarray]:
    """{tensor name: mean x**2 per input column}, over up to `max_windows` windows of `ctx` tokens of `text`."""
    backend = RecordingBackend()
    gguf = open_gguf(model_path)
    try:
        config = read_config(gguf)
        tokenizer = Tokenizer.from_metadata(gguf.metadata, source=gguf.path.name)
        model = build_model(config, gguf, backend)
        tokens = tokenizer.encode(text, add_bos=False)
        cache = KVCache(model, ctx)
        for start in range(0, min(len(tokens) - ctx, ctx * max_windows), ctx):
            cache.truncate(0)
            model.forward(np.asarray(tokens[start : start + ctx], dtype=np.int64), 0, cache.storage)
    finally:
        backend.close()
        gguf.close()
    if not backend.counts:
        raise ValueError(f"the text has {len(tokens)} tokens: an importance matrix needs more than {ctx}")
    return {name: (backend.sums[name] / backend.counts[name]).astype(np.float32) for name in backend.sums}


def main() -> None:
    """Measure the importance matrix of `--model` over `--text` and write it to `--out` (.npz)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="GGUF path, or a bundled model: smollm2, gemma3")
    parser.add_argument("--out", required=True, help="the .npz file to write")
    parser.add_argument("--text", default=str(DEFAULT_TEXT))
    parser.add_argument("--ctx", type=int, default=128)
    parser.add_argument("--windows", type=int, default=4)
    args = parser.parse_args()
    matrix = importance_matrix(resolve_model_path(args.model), Path(args.text).read_text(), args.ctx, args.windows)
    np.savez(args.out, **matrix)
    print(f"{args.out}: {len(matrix)} matrices")


if __name__ == "__main__":
    main()
