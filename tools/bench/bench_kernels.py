"""One native matrix product at a time, timed: the kernels' own speed, without a model.

Random blocks of a GGUF type, in the shape of a model's matrix, times T tokens; prints
G weight-tokens per second of wall time and of CPU time (the machine is shared: CPU time
is the steadier figure). Compare builds by running it from two checkouts, alternating:

    PYTHONPATH=. python -m tools.bench.bench_kernels Q8_0:262144x640:1 Q4_K:2048x640:256
"""

import argparse
import resource
import time

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from backends.cpu_backend import CpuBackend, CpuMatrix


def random_blocks(qtype: GGMLQuantizationType, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """(rows * bytes per row,) uint8: random blocks with small finite fp16 scales."""
    per_block, block_bytes = GGML_QUANT_SIZES[qtype]
    n_blocks = rows * cols // per_block
    blocks = rng.integers(0, 256, size=(n_blocks, block_bytes), dtype=np.uint8)
    offsets = {
        GGMLQuantizationType.Q6_K: (208,),
        GGMLQuantizationType.Q4_1: (0, 2),
        GGMLQuantizationType.Q5_1: (0, 2),
        GGMLQuantizationType.Q4_K: (0, 2),
        GGMLQuantizationType.Q5_K: (0, 2),
        GGMLQuantizationType.Q2_K: (80, 82),
        GGMLQuantizationType.Q3_K: (108,),
        GGMLQuantizationType.TQ2_0: (64,),
        GGMLQuantizationType.TQ1_0: (52,),
    }.get(qtype, (0,))
    if qtype == GGMLQuantizationType.MXFP4:  # an E8M0 scale byte: 2^-12 .. 2^0, as real weights (no subnormal products)
        blocks[:, 0] = rng.integers(116, 129, size=n_blocks)
        return blocks.reshape(-1)  # (n_blocks * block_bytes,)
    for offset in offsets:
        scales = (0.05 * rng.standard_normal(n_blocks)).astype(np.float16)
        blocks[:, offset : offset + 2] = scales.view(np.uint8).reshape(n_blocks, 2)  # (n_blocks, 2)
    return blocks.reshape(-1)  # (n_blocks * block_bytes,)


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cases", nargs="+", help="TYPE:ROWSxCOLS:TOKENS, e.g. Q4_K:2048x640:256")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=1.0, help="time spent on each case")
    parser.add_argument(
        "--runs", type=int, default=0, help="a fixed number of products per case instead (for perf stat)"
    )
    args = parser.parse_args()
    backend = CpuBackend(threads=args.threads)
    rng = np.random.default_rng(0)
    for case in args.cases:
        name, shape, tokens = case.split(":")
        rows, cols = (int(v) for v in shape.split("x"))
        qtype = GGMLQuantizationType[name]
        weight = CpuMatrix("w", random_blocks(qtype, rows, cols, rng), int(qtype), rows, cols)
        x = rng.standard_normal((int(tokens), cols)).astype(np.float32)
        backend.linear(x, weight)  # warm: pages and scratch buffers
        runs, wall0, cpu0 = 0, time.perf_counter(), cpu_seconds()
        while (runs < args.runs) if args.runs else (time.perf_counter() - wall0 < args.seconds):
            backend.linear(x, weight)
            runs += 1
        wall, cpu = time.perf_counter() - wall0, cpu_seconds() - cpu0
        work = runs * rows * cols * int(tokens) / 1e9
        print(
            f"{case:28s} {work / wall:7.2f} G/s wall  {work / cpu:7.2f} G/s CPU  ({runs} runs, {backend.native.TIER})"
        )


if __name__ == "__main__":
    main()
