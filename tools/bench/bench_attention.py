"""The cpu backend's attention op alone, timed: T new tokens at a start position, over a
cache filled with random keys and values before it (a Qwen3-4B layer by default: 32
query heads, 8 KV heads of 128).

Each case is KV_TYPE:T:START; prints ms per call of wall time and of CPU time (the machine
is shared: CPU time is the steadier figure). Compare builds by running it from two
checkouts, alternating:

    PYTHONPATH=. python -m tools.bench.bench_attention f16:256:4096 q8_0:256:16384 f16:1:16384
"""

import argparse
import time

import numpy as np

from backends.base import AttentionState, LayerAttention
from backends.cpu_backend import CpuBackend
from backends.kv_types import encode_rows
from tools.bench.bench_kernels import cpu_seconds


def time_case(
    backend: CpuBackend, case: str, heads: int, kv_heads: int, dim: int, seconds: float
) -> tuple[float, float]:
    """(wall ms, CPU ms) per call of one KV_TYPE:T:START case."""
    kv_type, tokens, start = case.split(":")
    n_new, pos = int(tokens), int(start)
    rng = np.random.default_rng(0)
    state = backend.allocate_state([AttentionState(kv_heads, dim, dim, pos + n_new, kv_type=kv_type)])
    for cache in (state.keys[0], state.values[0]):  # (kv_heads, slots, row): random rows before pos
        assert cache is not None
        cache[:, :pos] = encode_rows(kv_type, rng.standard_normal((kv_heads, pos, dim)).astype(np.float32))
    q = rng.standard_normal((n_new, heads, dim)).astype(np.float32)
    k, v = (rng.standard_normal((n_new, kv_heads, dim)).astype(np.float32) for _ in range(2))
    settings = LayerAttention(scale=dim**-0.5)
    backend.attention(q, k, v, state, 0, pos, settings)  # warm-up
    calls, wall0, cpu0 = 0, time.perf_counter(), cpu_seconds()
    while time.perf_counter() - wall0 < seconds or calls < 3:
        backend.attention(q, k, v, state, 0, pos, settings)
        calls += 1
    return 1e3 * (time.perf_counter() - wall0) / calls, 1e3 * (cpu_seconds() - cpu0) / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cases", nargs="+", help="KV_TYPE:T:START, e.g. f16:256:16384")
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--dim", type=int, default=128, help="head_dim = value_dim")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=3.0, help="timed per case")
    args = parser.parse_args()
    backend = CpuBackend(threads=args.threads)
    for case in args.cases:
        wall, cpu = time_case(backend, case, args.heads, args.kv_heads, args.dim, args.seconds)
        print(f"{case:>16}  {wall:9.2f} ms wall  {cpu:9.2f} ms CPU", flush=True)


if __name__ == "__main__":
    main()
