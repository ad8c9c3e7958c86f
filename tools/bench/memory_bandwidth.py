"""Memory bandwidth as a float32 decode step sees it, for the ceiling in docs/benchmarks.md.

    .venv/bin/python tools/bench/memory_bandwidth.py

A decode step multiplies one activation row by every weight matrix, so its speed limit is
how fast BLAS can stream a matrix far larger than the caches. This times exactly that (a
1 GiB float32 matrix-vector product, all BLAS threads) and, for comparison, a plain
single-threaded `sum` over the same array.
"""

import time

import numpy as np


def main() -> None:
    weights = np.random.default_rng(0).random((262144, 1024), dtype=np.float32)  # 1 GiB
    x = np.ones((1, 1024), dtype=np.float32)
    for _ in range(2):
        x @ weights.T
    repeats = 10
    started = time.perf_counter()
    for _ in range(repeats):
        x @ weights.T
    matvec_s = (time.perf_counter() - started) / repeats
    started = time.perf_counter()
    for _ in range(repeats):
        weights.sum()
    sum_s = (time.perf_counter() - started) / repeats
    print(f"matvec: {weights.nbytes / matvec_s / 1e9:.1f} GB/s   sum: {weights.nbytes / sum_s / 1e9:.1f} GB/s")


if __name__ == "__main__":
    main()
