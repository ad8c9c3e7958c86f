"""Re-quantize a GGUF file with llama.cpp's quantizer (llama-cpp-python's `llama_model_quantize`).

Run with a Python that has llama-cpp-python (`make peer-venv` builds .venv-peer):

    .venv-peer/bin/python tools/requantize.py SRC.gguf OUT.gguf IQ2_XXS --imatrix smollm2.imatrix.npz

TYPE is a llama.cpp file type without its LLAMA_FTYPE_MOSTLY_ prefix (Q2_K, Q3_K_M, IQ4_XS,
IQ2_XXS, TQ2_0, ...). The source may itself be quantized (--allow-requantize is implied).
`--imatrix` is an .npz of mean squared activations per input column (tools/make_imatrix.py),
passed as llama.cpp's `llama_model_imatrix_data` array; the IQ1, IQ2 and IQ3_XXS types need
one. llama.cpp picks each tensor's type by its own rules: rows that do not split into its
blocks fall back to another type, as in any file it writes.

It also prints llama.cpp's perplexity of a list of token ids (`--perplexity TOKENS.json
--ctx N --windows W`), scored as engine/perplexity.py scores it (llama-perplexity's windows).
"""

import argparse
import ctypes
import json

import numpy as np


def quantize(src: str, out: str, ftype_name: str, imatrix_path: str | None = None, threads: int = 2) -> None:
    """Write `src` quantized to llama.cpp's file type `ftype_name` into `out`."""
    import llama_cpp

    ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{ftype_name}", None)
    if ftype is None:
        raise SystemExit(f"llama.cpp has no file type {ftype_name}")
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftype
    params.nthread = threads
    params.allow_requantize = True
    keep = []  # the arrays the entries point into, alive until the call returns
    if imatrix_path:
        matrices = np.load(imatrix_path)
        entries = (llama_cpp.llama_model_imatrix_data * (len(matrices.files) + 1))()  # NULL-name terminated
        for entry, name in zip(entries[:-1], matrices.files, strict=True):
            values = np.ascontiguousarray(matrices[name], dtype=np.float32)
            keep.append(values)
            entry.name = name.encode()
            entry.data = values.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
            entry.size = values.size
        params.imatrix = entries
    if llama_cpp.llama_model_quantize(src.encode(), out.encode(), ctypes.byref(params)) != 0:
        raise SystemExit(f"llama.cpp could not quantize {src} to {ftype_name}")


def perplexity(model_path: str, tokens: list[int], ctx: int, windows: int, bos: int | None) -> float:
    """llama.cpp's perplexity of `tokens`: engine/perplexity.py's windows and scoring, its logits."""
    from llama_cpp import Llama

    llm = Llama(model_path=model_path, n_ctx=ctx, n_batch=ctx, logits_all=True, n_threads=2, verbose=False)
    nll, scored = 0.0, 0
    starts = [s for s in range(0, len(tokens), ctx) if s + ctx < len(tokens)][:windows]
    for start in starts:
        window = list(tokens[start : start + ctx])
        if bos is not None:
            window[0] = bos
        llm.reset()
        llm.eval(window)
        logits = np.asarray(llm.scores[: len(window)], dtype=np.float64)  # (ctx, vocab)
        first = ctx // 2
        rows = logits[first : ctx - 1]  # (ctx - 1 - first, vocab)
        shifted = rows - rows.max(axis=-1, keepdims=True)
        logprobs = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
        targets = np.asarray(window[first + 1 :])
        nll -= float(logprobs[np.arange(len(targets)), targets].sum())
        scored += len(targets)
    llm.close()
    return float(np.exp(nll / scored))


def main() -> None:
    """Quantize, or print llama.cpp's perplexity as JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("src")
    parser.add_argument("out", nargs="?")
    parser.add_argument("ftype", nargs="?")
    parser.add_argument("--imatrix")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--perplexity", help='a JSON file: {"tokens": [...], "bos": id or null}')
    parser.add_argument("--ctx", type=int, default=128)
    parser.add_argument("--windows", type=int, default=2)
    args = parser.parse_args()
    if args.perplexity:
        with open(args.perplexity) as f:
            request = json.load(f)
        print(json.dumps({"ppl": perplexity(args.src, request["tokens"], args.ctx, args.windows, request["bos"])}))
    elif args.out and args.ftype:
        quantize(args.src, args.out, args.ftype, args.imatrix, args.threads)
    else:
        parser.error("give SRC OUT TYPE, or SRC --perplexity TOKENS.json")


if __name__ == "__main__":
    main()
