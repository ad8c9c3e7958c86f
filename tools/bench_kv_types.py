"""Decode speed and memory with a float16 and a Q8_0 KV cache, ours against llama.cpp's, at
several context depths: the rows of docs/benchmarks.md's KV-type table.

    .venv/bin/python tools/bench_kv_types.py MODEL.gguf [MODEL.gguf ...] \\
        --depths 1024 4096 8192 --kv-types f16 q8_0 --threads 2 --gen-tokens 64

For each model, depth and KV type it runs, each in a fresh process (so each RSS is its own):
- `python -m engine bench --backend cpu --kv-type T --prompt-tokens DEPTH --fill F --json`
  (`--fill random` puts the context in the cache with random keys and values instead of
  prefilling it: a decode step costs the same, and an 8B model's 8k-token prefill takes many
  minutes on two cores; `--fill prefill` times the prefill too);
- `tools/bench_llama_cpp.py MODEL --kv-type T --prompt-tokens DEPTH --json` under the
  reference venv's python (`--peer-python`), which always prefills (llama.cpp has no cheaper
  way to a deep context), flash attention on.
It prints a Markdown table: decode tok/s of both and their ratio, and RSS after the run of
both and their ratio; `--json` prints the raw figures instead. `--skip-peer` runs ours alone.
"""

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine.bundled import resolve_model_path  # noqa: E402  (after the path)


def run_json(command: list[str]) -> dict:
    """The JSON a benchmark command prints last on stdout; RuntimeError with its stderr if it fails."""
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr.strip()}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def ours(model: str, depth: int, kv_type: str, args: argparse.Namespace) -> dict:
    return run_json(
        [
            sys.executable,
            "-m",
            "engine",
            "bench",
            "--model",
            model,
            "--backend",
            "cpu",
            "--threads",
            str(args.threads),
            "--kv-type",
            kv_type,
            "--prompt-tokens",
            str(depth),
            "--gen-tokens",
            str(args.gen_tokens),
            "--fill",
            args.fill,
            "--json",
        ]
    )


def peer(model: str, depth: int, kv_type: str, args: argparse.Namespace) -> dict:
    return run_json(
        [
            args.peer_python,
            str(ROOT / "tools" / "bench_llama_cpp.py"),
            model,
            "--threads",
            str(args.threads),
            "--kv-type",
            kv_type,
            "--prompt-tokens",
            str(depth),
            "--gen-tokens",
            str(args.gen_tokens),
            "--json",
        ]
    )


def row(model: str, depth: int, kv_type: str, mine: dict, theirs: dict | None) -> str:
    """One Markdown table row."""
    rss = mine["rss_bytes"]["after_run"] / 1e6
    cells = [Path(model).name, str(depth), kv_type, f"{mine['decode_tok_s']:.2f}", f"{rss:.0f}"]
    if theirs is None:
        return "| " + " | ".join([*cells, "", "", "", ""]) + " |"
    peer_rss = theirs["rss_bytes"]["after_run"] / 1e6
    cells += [
        f"{theirs['decode_tok_s']:.2f}",
        f"{mine['decode_tok_s'] / theirs['decode_tok_s']:.2f}x",
        f"{peer_rss:.0f}",
        f"{rss / peer_rss:.2f}x",
    ]
    return "| " + " | ".join(cells) + " |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+", help="GGUF paths, or a bundled model: smollm2")
    parser.add_argument("--depths", type=int, nargs="+", default=[1024, 4096, 8192])
    parser.add_argument("--kv-types", nargs="+", choices=("f16", "q8_0", "f32"), default=["f16", "q8_0"])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--gen-tokens", type=int, default=64)
    parser.add_argument("--fill", choices=("prefill", "random"), default="random")
    parser.add_argument("--peer-python", default="/work/refvenv/bin/python")
    parser.add_argument("--skip-peer", action="store_true")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if not args.json:
        print(
            "| model | depth | KV | ours tok/s | ours RSS MB | llama.cpp tok/s | ratio | llama.cpp RSS MB | RSS ratio |"
        )
        print("|---|---:|---|---:|---:|---:|---:|---:|---:|")
    for model in [str(resolve_model_path(m)) for m in args.models]:  # "smollm2": the bundled file
        for depth in args.depths:
            for kv_type in args.kv_types:
                mine = ours(model, depth, kv_type, args)
                theirs = None if args.skip_peer else peer(model, depth, kv_type, args)
                if args.json:
                    print(
                        json.dumps({"model": model, "depth": depth, "kv_type": kv_type, "ours": mine, "peer": theirs})
                    )
                else:
                    print(row(model, depth, kv_type, mine, theirs), flush=True)


if __name__ == "__main__":
    main()
