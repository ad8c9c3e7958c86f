"""The GPU's device-to-device copy bandwidth: the yardstick of decode, which is bound by reading its weights.

    python -m tools.gpu.copy_bandwidth      # prints JSON

Copies a 1 GiB buffer into another 20 times between CUDA events, after 3 warm-ups, with
PyTorch (or CuPy where PyTorch is missing). A copy reads and writes every byte, so the
memory traffic is twice the buffer per copy: `traffic_gb_s`, the figure a decode step's
reads are compared with.
"""

import json

NBYTES = 1 << 30
WARMUPS, REPEATS = 3, 20


def copy_seconds() -> tuple[float, str]:
    """Seconds one copy of NBYTES takes on the GPU, and the library that timed it."""
    try:
        import torch
    except ImportError:
        import cupy

        src, dst = cupy.empty(NBYTES, dtype=cupy.uint8), cupy.empty(NBYTES, dtype=cupy.uint8)
        for _ in range(WARMUPS):
            dst[...] = src
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        for _ in range(REPEATS):
            dst[...] = src
        end.record()
        end.synchronize()
        return cupy.cuda.get_elapsed_time(start, end) / 1000 / REPEATS, f"cupy {cupy.__version__}"
    src = torch.empty(NBYTES, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    for _ in range(WARMUPS):
        dst.copy_(src)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(REPEATS):
        dst.copy_(src)
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1000 / REPEATS, f"torch {torch.__version__}"


def main() -> None:
    """Print the copy's bytes, seconds and memory traffic (GB/s, reads and writes) as JSON."""
    seconds, timed_by = copy_seconds()
    print(json.dumps({"bytes": NBYTES, "seconds": seconds, "traffic_gb_s": 2 * NBYTES / seconds / 1e9,
                      "timed_by": timed_by}))  # fmt: skip


if __name__ == "__main__":
    main()
