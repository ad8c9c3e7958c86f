"""What one batched decode pass costs against each sequence's own decode step.

    python tools/bench/batch_step_bench.py [--model smollm2] [--backend cpu] [--repeats 15]

Prefills four caches with different prompts, then times, interleaved, `--repeats` times:
B sequences' own decode steps one after another (`decode_step`, compiled where the backend
compiles) and one `decode_batch` pass over the B of them, for B = 2 and 4. Prints the
median and best milliseconds per pass and per token, and the load average, as JSON lines.
"""

import argparse
import json
import os
import time

import numpy as np

from engine.bundled import resolve_model_path
from engine.generation import prefill
from engine.loader import load_model


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--backend", default="cpu")
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    loaded = load_model(resolve_model_path(args.model), args.backend)
    model = loaded.model
    caches = [loaded.new_cache(256) for _ in range(4)]
    for i, cache in enumerate(caches):
        prefill(model, cache, loaded.tokenizer.encode(f"Once upon a time, story {i}:"))
    positions = [cache.n_used for cache in caches]  # every timing rewrites the same positions

    def alone(b: int) -> None:
        for cache, position in zip(caches[:b], positions[:b], strict=True):
            loaded.backend.to_host(model.decode_step(cache.storage)(42, position))

    def batched(b: int) -> None:
        storages = [cache.storage for cache in caches[:b]]
        loaded.backend.to_host(model.decode_batch(np.full(b, 42), np.array(positions[:b]), storages))

    times: dict[tuple[str, int], list[float]] = {}
    for _ in range(args.repeats):
        for b in (2, 4):
            for name, run in (("own steps", alone), ("one pass", batched)):
                started = time.perf_counter()
                run(b)
                times.setdefault((name, b), []).append(time.perf_counter() - started)
    for (name, b), seconds in times.items():
        median, best = float(np.median(seconds)) * 1000, min(seconds) * 1000
        print(json.dumps({"backend": loaded.backend.name, "sequences": b, "how": name,
                          "ms_median": round(median, 1), "ms_best": round(best, 1),
                          "ms_per_token_median": round(median / b, 1), "load_average": os.getloadavg()[0]}))
    loaded.close()


if __name__ == "__main__":
    main()
