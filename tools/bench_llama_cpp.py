"""The peer's figures for docs/benchmarks.md: llama.cpp (llama-cpp-python) on the same model.

Run with the dev-only reference venv that has llama-cpp-python installed:
    /work/refvenv/bin/python tools/bench_llama_cpp.py MODEL.gguf --threads 2 --json
It mirrors `python -m engine bench`: 256 random prompt tokens (seed 0), then 128 decode
steps one token at a time, after a warm-up, and prints the same JSON keys. The decoded
tokens are taken from the prompt rather than by argmax: a step costs the same either way.
It also prints `load_s`, the seconds it takes to construct `Llama` (read and map the
file, build the vocabulary, allocate the context), and `rss_bytes`, the process's
resident memory after that load and after the timed run. llama.cpp maps the file and
prefetches it while loading, so the weights' pages count from the first figure on.

`--kv-type f16|q8_0|f32` sets llama.cpp's `type_k` and `type_v` to that type, with flash
attention on (llama.cpp stores a quantized V cache only with it; its own CLI turns it on by
default on CPU); without it the context keeps this script's earlier settings (float16 KV,
flash attention off). Prompts longer than 512 tokens are evaluated 512 at a time.

`--plain-buffers` keeps llama.cpp's weights in plain CPU buffers: this build (0.3.36) crashes
on the first evaluation of a quantized mixture-of-experts file when they go to its "extra"
buffer types (weights repacked for its faster kernels), so the MoE rows of
docs/benchmarks.md are measured with it, and say so.
"""

import argparse
import json
import time
from pathlib import Path

import llama_cpp
import numpy as np
from llama_cpp import Llama

KV_TYPES = {"f32": llama_cpp.GGML_TYPE_F32, "f16": llama_cpp.GGML_TYPE_F16, "q8_0": llama_cpp.GGML_TYPE_Q8_0}

try:
    import psutil
except ImportError:  # the reference venv may lack it
    psutil = None


def rss_bytes() -> int:
    """This process's resident memory in bytes: psutil's figure, or VmRSS from /proc/self/status."""
    if psutil is not None:
        return psutil.Process().memory_info().rss
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024  # "VmRSS:   123456 kB"
    raise RuntimeError("no VmRSS in /proc/self/status")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--prompt-tokens", type=int, default=256)
    parser.add_argument("--gen-tokens", type=int, default=128)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--plain-buffers", action="store_true", help="no repacked (extra) weight buffers")
    parser.add_argument("--kv-type", choices=sorted(KV_TYPES), default=None, help="type_k and type_v, flash attention on")
    args = parser.parse_args()
    if args.plain_buffers:
        defaults = llama_cpp.llama_cpp.llama_model_default_params  # what Llama() asks for its model's params

        def plain() -> llama_cpp.llama_model_params:
            params = defaults()
            params.use_extra_bufts = False
            return params

        llama_cpp.llama_cpp.llama_model_default_params = plain

    started = time.perf_counter()
    kv = {} if args.kv_type is None else {"type_k": KV_TYPES[args.kv_type], "type_v": KV_TYPES[args.kv_type],
                                          "flash_attn": True}
    llm = Llama(model_path=args.model, n_ctx=args.prompt_tokens + args.gen_tokens + 8,
                n_batch=min(args.prompt_tokens, 512), n_threads=args.threads, n_threads_batch=args.threads,
                verbose=False, **kv)
    load_s = time.perf_counter() - started
    rss_after_load = rss_bytes()
    prompt = np.random.default_rng(0).integers(0, llm.n_vocab(), size=args.prompt_tokens).tolist()

    def run_once(n_prompt: int, n_gen: int) -> tuple[float, float]:
        llm.reset()
        started = time.perf_counter()
        llm.eval(prompt[:n_prompt])
        prefill_s = time.perf_counter() - started
        started = time.perf_counter()
        for step in range(n_gen):
            llm.eval([prompt[step % len(prompt)]])
        return prefill_s, time.perf_counter() - started

    run_once(32, 4)
    prefill_s, decode_s = run_once(args.prompt_tokens, args.gen_tokens)
    figures = {"peer": "llama.cpp (llama-cpp-python)", "threads": args.threads, "kv_type": args.kv_type,
               "prompt_tokens": args.prompt_tokens, "gen_tokens": args.gen_tokens,
               "prefill_tok_s": args.prompt_tokens / prefill_s, "decode_tok_s": args.gen_tokens / decode_s,
               "load_s": load_s, "rss_bytes": {"after_load": rss_after_load, "after_run": rss_bytes()}}
    print(json.dumps(figures) if args.json else figures)


if __name__ == "__main__":
    main()
