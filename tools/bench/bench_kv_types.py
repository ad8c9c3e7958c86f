"""Decode speed and memory with a float16 and a Q8_0 KV cache, ours against llama.cpp's, at
several context depths: the rows of docs/benchmarks.md's KV-type table.

    .venv/bin/python tools/bench/bench_kv_types.py MODEL.gguf [MODEL.gguf ...] \\
        --depths 4096 16384 32768 --kv-types f16 q8_0 --threads 2 --gen-tokens 32

For each model, depth and KV type it runs, each in a fresh process (so each RSS is its own):
- `python -m engine bench --backend cpu --kv-type T --prompt-tokens DEPTH --fill F --json`;
- `tools/bench/bench_llama_cpp.py MODEL --kv-type T --prompt-tokens DEPTH --fill F' --json` under
  the peer's python (`--peer-python`), flash attention on.

How each reaches DEPTH tokens of context (`--fill`):
- `random` (the default): neither prefills it. Sprig holds DEPTH tokens with random keys and
  values of the cache's type (`engine bench --fill random`); llama.cpp prefills 256 tokens
  for real and holds their cells tiled to DEPTH positions (`--fill tiled`, loaded through its
  own state API: `tools/bench/llama_kv_state.py`). A decode step reads every cached position
  whatever it holds, so decode speed and memory are those of a real context of that depth,
  at a cost of seconds instead of a prefill (tens of minutes at 16k for a 4B model on two
  cores, on each side). No prefill figure.
- `prefill`: both prefill DEPTH random tokens (seed 0), and the table gives both prefill
  speeds too: the prefill rows.

It prints a Markdown table: decode tok/s of both and their ratio, RSS after the run of both
and their ratio (and with `--fill prefill` prefill tok/s of both and their ratio); `--json`
prints the raw figures instead. `--skip-peer` runs ours alone.
"""

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
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
            str(ROOT / "tools" / "bench" / "bench_llama_cpp.py"),
            model,
            "--threads",
            str(args.threads),
            "--kv-type",
            kv_type,
            "--prompt-tokens",
            str(depth),
            "--gen-tokens",
            str(args.gen_tokens),
            "--fill",
            "tiled" if args.fill == "random" else "prefill",
            "--json",
        ]
    )


def row(model: str, depth: int, kv_type: str, mine: dict, theirs: dict | None, prefill: bool) -> str:
    """One Markdown table row (with the prefill columns when `prefill`)."""
    rss = mine["rss_bytes"]["after_run"] / 1e6
    cells = [Path(model).name, str(depth), kv_type, f"{mine['decode_tok_s']:.2f}", f"{rss:.0f}"]
    if theirs is None:
        cells += [""] * 4
    else:
        peer_rss = theirs["rss_bytes"]["after_run"] / 1e6
        cells += [
            f"{theirs['decode_tok_s']:.2f}",
            f"{mine['decode_tok_s'] / theirs['decode_tok_s']:.2f}x",
            f"{peer_rss:.0f}",
            f"{rss / peer_rss:.2f}x",
        ]
    if prefill:
        speeds = [mine["prefill_tok_s"], theirs["prefill_tok_s"] if theirs else None]
        cells += [f"{v:.2f}" if v else "" for v in speeds]
        cells.append(f"{speeds[0] / speeds[1]:.2f}x" if speeds[1] else "")
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
    prefill = args.fill == "prefill"
    if not args.json:
        head = (
            "| model | depth | KV | ours tok/s | ours RSS MB | llama.cpp tok/s | ratio | llama.cpp RSS MB | RSS ratio |"
        )
        print(head + (" ours prefill tok/s | llama.cpp prefill tok/s | prefill ratio |" if prefill else ""))
        print("|---|---:|---|---:|---:|---:|---:|---:|---:|" + ("---:|---:|---:|" if prefill else ""))
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
                    print(row(model, depth, kv_type, mine, theirs, prefill), flush=True)


if __name__ == "__main__":
    main()
