"""Sprig and llama.cpp on the same models, interleaved, for docs/benchmarks.md.

    .venv/bin/python -m tools.bench.bench_side_by_side --peer-python /work/refvenv/bin/python \\
        --model smollm2 --model gemma3 --model /work/models/bonsai-1.7b-shape-q1_0.gguf [--rounds 2]

For each model and round it runs `python -m engine bench` (backend cpu, 2 threads) and
tools/bench/bench_llama_cpp.py (2 threads) one after the other, each in a fresh process, and
prints every figure as JSON lines, then a table of the best run of each with the ratios,
and the load average before each run.
"""

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from engine.bundled import resolve_model_path

ROOT = Path(__file__).resolve().parents[2]


def run(command: list[str]) -> dict:
    """Run a bench command and return its JSON figures, with the load average before it."""
    load = os.getloadavg()[0]
    result = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, check=True)
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    figures["load_before"] = load
    return figures


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--peer-python", required=True, help="a Python with llama-cpp-python installed")
    parser.add_argument("--model", action="append", required=True)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--prompt-tokens", type=int, default=256)
    parser.add_argument("--gen-tokens", type=int, default=128)
    args = parser.parse_args()
    sizes = ["--prompt-tokens", str(args.prompt_tokens), "--gen-tokens", str(args.gen_tokens)]
    best: dict[tuple[str, str], dict] = {}
    for _ in range(args.rounds):
        for model in args.model:
            path = str(resolve_model_path(model))
            ours = run([sys.executable, "-m", "engine", "bench", "--model", path, "--backend", "cpu",
                        "--threads", str(args.threads), "--json", *sizes])
            peer = run([args.peer_python, "tools/bench/bench_llama_cpp.py", path, "--threads", str(args.threads),
                        "--json", *sizes])
            for name, figures in (("sprig", ours), ("llama.cpp", peer)):
                print(json.dumps({"model": Path(path).name, "who": name, **figures}), flush=True)
                kept = best.setdefault((path, name), figures)
                for key in ("prefill_tok_s", "decode_tok_s"):
                    kept[key] = max(kept[key], figures[key])
    print("\n| Model | | Prefill tok/s | Decode tok/s | Load s | RSS after run | load avg |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for model in args.model:
        path = str(resolve_model_path(model))
        ours, peer = best[(path, "sprig")], best[(path, "llama.cpp")]
        for name, f in (("Sprig cpu", ours), ("llama.cpp", peer)):
            print(f"| {Path(path).name} | {name} | {f['prefill_tok_s']:.1f} | {f['decode_tok_s']:.1f} | "
                  f"{f['load_s']:.2f} | {f['rss_bytes']['after_run'] / 1e9:.2f} GB | {f['load_before']:.2f} |")
        print(f"| | **ratio** | **{ours['prefill_tok_s'] / peer['prefill_tok_s']:.2f}×** | "
              f"**{ours['decode_tok_s'] / peer['decode_tok_s']:.2f}×** | | | |")


if __name__ == "__main__":
    main()
