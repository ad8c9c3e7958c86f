"""The peer's figures for docs/benchmarks.md: llama.cpp (llama-cpp-python) on the same model.

Run with the dev-only reference venv that has llama-cpp-python installed:
    /work/refvenv/bin/python tools/bench/bench_llama_cpp.py MODEL.gguf --threads 2 --json
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

`--fill tiled` puts the prompt in llama.cpp's KV cache without prefilling all of it: a
prefill of its first `--tile-tokens` (256) for real, whose cells are then repeated to the
prompt's length and loaded (`tools/bench/llama_kv_state.py` says how, and why that is a fair
decode figure); it needs `--kv-type` (flash attention on). Its prefill figure is left out
(None), as `engine bench --fill random` leaves out Sprig's. `--check-fill` first proves the
filling on the model at hand: a cache refilled from its own state (no tiling) gives the next
token's logits bit for bit, and the tiled cache holds the prompt's positions and decodes to
finite logits; the JSON says so under `fill_check`.

`--plain-buffers` keeps llama.cpp's weights in plain CPU buffers: this build (0.3.36) crashes
on the first evaluation of a quantized mixture-of-experts file when they go to its "extra"
buffer types (weights repacked for its faster kernels), so the MoE rows of
docs/benchmarks.md are measured with it, and say so.
"""

import argparse
import ctypes
import json
import sys
import tempfile
import time
from pathlib import Path

import llama_cpp
import numpy as np
from llama_cpp import Llama

KV_TYPES = {"f32": llama_cpp.GGML_TYPE_F32, "f16": llama_cpp.GGML_TYPE_F16, "q8_0": llama_cpp.GGML_TYPE_Q8_0}

sys.path.insert(0, str(Path(__file__).resolve().parent))
from llama_kv_state import read_sequence_state, write_tiled_sequence_file  # noqa: E402  (beside this script)

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


def sequence_state(llm: Llama) -> bytes:
    """The bytes of sequence 0's state (`llama_state_seq_get_data`)."""
    size = llama_cpp.llama_state_seq_get_size(llm.ctx, 0)
    buffer = (ctypes.c_uint8 * size)()
    written = llama_cpp.llama_state_seq_get_data(llm.ctx, buffer, size, 0)
    return ctypes.string_at(buffer, written)


def fill_tiled(llm: Llama, prompt: list[int], tile_tokens: int, folder: Path) -> None:
    """Hold `prompt` in `llm`'s cache: a prefill of its first `tile_tokens`, tiled to its length and
    loaded into the cache emptied (its buffers zeroed)."""
    llm.reset()
    llm.eval(prompt[:tile_tokens])
    path = folder / "tiled.ggsq"
    write_tiled_sequence_file(path, read_sequence_state(sequence_state(llm)), prompt)
    llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(llm.ctx), True)
    tokens, count = (llama_cpp.llama_token * len(prompt))(), ctypes.c_size_t(0)
    if not llama_cpp.llama_state_seq_load_file(llm.ctx, str(path).encode(), 0, tokens, len(prompt),
                                               ctypes.byref(count)):
        raise RuntimeError("llama.cpp refused the tiled state")
    path.unlink()
    llm.n_tokens = len(prompt)
    llm.input_ids[: len(prompt)] = prompt


def next_logits(llm: Llama, token: int) -> np.ndarray:
    """The logits after feeding `token` at the cache's end (the cache then holds it too)."""
    llm.eval([token])
    return np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(llm.n_vocab(),)).copy()


def check_fill(llm: Llama, prompt: list[int], tile_tokens: int, folder: Path) -> dict:
    """Evidence that `fill_tiled` works on this model: refilled from its own state, the cache
    gives the logits a prefill gives, bit for bit; tiled, it holds every position and decodes."""
    short = prompt[:tile_tokens]
    llm.reset()
    llm.eval(short)
    expected = next_logits(llm, prompt[0])
    fill_tiled(llm, short, tile_tokens, folder)
    again = next_logits(llm, prompt[0])
    fill_tiled(llm, prompt, tile_tokens, folder)
    memory = llama_cpp.llama_get_memory(llm.ctx)
    deepest = llama_cpp.llama_memory_seq_pos_max(memory, 0)
    deep = next_logits(llm, prompt[0])
    return {"refilled_logits_equal": bool(np.array_equal(expected, again)), "positions": deepest + 1,
            "decoded_finite": bool(np.isfinite(deep).all())}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--prompt-tokens", type=int, default=256)
    parser.add_argument("--gen-tokens", type=int, default=128)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--plain-buffers", action="store_true", help="no repacked (extra) weight buffers")
    parser.add_argument("--kv-type", choices=sorted(KV_TYPES), default=None, help="type_k and type_v, flash attention on")
    parser.add_argument("--fill", choices=("prefill", "tiled"), default="prefill",
                        help="reach the prompt's depth by a prefill, or by a short prefill's cells tiled (see above)")
    parser.add_argument("--tile-tokens", type=int, default=256, help="the real prefill that --fill tiled repeats")
    parser.add_argument("--check-fill", action="store_true", help="first check --fill tiled on this model")
    args = parser.parse_args()
    if args.fill == "tiled" and args.kv_type is None:
        parser.error("--fill tiled needs --kv-type (flash attention on: values stored untransposed)")
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

    folder = tempfile.TemporaryDirectory()
    fill_check = check_fill(llm, prompt, min(args.tile_tokens, args.prompt_tokens), Path(folder.name)) \
        if args.check_fill else None

    def run_once(n_prompt: int, n_gen: int, fill: str = "prefill") -> tuple[float, float]:
        started = time.perf_counter()
        if fill == "tiled":
            fill_tiled(llm, prompt[:n_prompt], min(args.tile_tokens, n_prompt), Path(folder.name))
        else:
            llm.reset()
            llm.eval(prompt[:n_prompt])
        prefill_s = time.perf_counter() - started
        started = time.perf_counter()
        for step in range(n_gen):
            llm.eval([prompt[step % len(prompt)]])
        return prefill_s, time.perf_counter() - started

    run_once(32, 4)
    prefill_s, decode_s = run_once(args.prompt_tokens, args.gen_tokens, args.fill)
    folder.cleanup()
    figures = {"peer": "llama.cpp (llama-cpp-python)", "threads": args.threads, "kv_type": args.kv_type,
               "fill": args.fill, "prompt_tokens": args.prompt_tokens, "gen_tokens": args.gen_tokens,
               "prefill_tok_s": args.prompt_tokens / prefill_s if args.fill == "prefill" else None,
               "decode_tok_s": args.gen_tokens / decode_s, "load_s": load_s,
               "rss_bytes": {"after_load": rss_after_load, "after_run": rss_bytes()}, "fill_check": fill_check}
    print(json.dumps(figures) if args.json else figures)


if __name__ == "__main__":
    main()
