"""The GPU session's table: each benchmark's speed, the bytes a decode step reads, and how close that comes to
the GPU's measured memory bandwidth.

    python -m tools.gpu.gpu_table --bench bench.jsonl --bandwidth bandwidth.json --models DIR > gpu-table.md

`--bench` holds one JSON object per line, as `python -m engine bench --json` (and
tools/bench/bench_llama_cpp.py) print them; `--bandwidth` what tools/gpu/copy_bandwidth.py
printed. A decode step reads every weight once, except the token embeddings where the output
projection has its own matrix (then one row of them), and the f16 keys and values of every
earlier position: `bytes_per_token` counts both, at the decode's mean context length. Its
rate (bytes per token times tokens per second) over the copy's memory traffic is the share
of the bandwidth the step uses.
"""

import argparse
import json
from pathlib import Path

from engine.gguf_file import open_gguf

F16 = 2  # bytes per cached key or value element


def bytes_per_token(path: str | Path, context: float) -> float:
    """Bytes one decode step of model `path` reads at `context` positions: its weights and its f16 KV cache."""
    with open_gguf(path) as model:
        sizes = {name: tensor.n_bytes for name, tensor in model.tensors.items()}
        heads = model.arch_key("attention.head_count")
        head_dim = model.arch_key("embedding_length") // heads
        key_length = model.arch_key("attention.key_length", head_dim)
        value_length = model.arch_key("attention.value_length", head_dim)
        layers, kv_heads = model.arch_key("block_count"), model.arch_key("attention.head_count_kv", heads)
    weights = sum(sizes.values())
    if "output.weight" in sizes:  # untied: the embeddings give one row per token
        weights -= sizes["token_embd.weight"]
    return weights + F16 * layers * kv_heads * (key_length + value_length) * context


def table(runs: list[dict], traffic_gb_s: float, models: Path) -> str:
    """The markdown table of `runs` (engine bench's JSON objects) against `traffic_gb_s`."""
    lines = [
        f"Copy bandwidth (device to device, reads and writes): {traffic_gb_s:,.0f} GB/s",
        "",
        "| model | backend | prefill tok/s | decode tok/s | MB read per token | decode GB/s | % of copy bandwidth |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for run in runs:
        context = run["prompt_tokens"] + run["gen_tokens"] / 2
        per_token = bytes_per_token(models / run["model"], context)
        rate = per_token * run["decode_tok_s"] / 1e9
        prefill = "–" if run.get("prefill_tok_s") is None else f"{run['prefill_tok_s']:,.0f}"
        lines.append(
            f"| {run['model']} | {run['backend']} | {prefill} | {run['decode_tok_s']:,.1f} | {per_token / 1e6:,.1f} "
            f"| {rate:,.0f} | {100 * rate / traffic_gb_s:.0f}% |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    """Print the table of `--bench`'s runs against `--bandwidth`."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bench", type=Path, required=True, help="one engine bench JSON object per line")
    parser.add_argument("--bandwidth", type=Path, required=True, help="tools/gpu/copy_bandwidth.py's JSON")
    parser.add_argument("--models", type=Path, required=True, help="the folder of the benchmarked .gguf files")
    args = parser.parse_args()
    runs = [json.loads(line) for line in args.bench.read_text().splitlines() if line.startswith("{")]
    print(table(runs, json.loads(args.bandwidth.read_text())["traffic_gb_s"], args.models), end="")


if __name__ == "__main__":
    main()
