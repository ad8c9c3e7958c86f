"""How long reopening a long conversation takes: restoring its saved state against reading it again.

    python -m tools.bench.bench_reopen [--model smollm2] [--backend cpu] [--tokens 4096] [--context 8192]
                                 [--fill prefill|random] [--kv-type f16|q8_0|f32] [--reread-repeats N]

Fills a cache of `--context` positions with `--tokens` random tokens (seed 0), through a
prefill or (`--fill random`, for a long context on a big model, where that prefill alone
takes tens of minutes) with random keys and values of the cache's type
(`engine.bench.fill_at_random`: the file's size and the save and restore times are those of
a real state of that length, since only zeros are left out). Then it times, `--repeats`
times each and interleaved: saving it as the app does when a conversation is left
(`engine.saved_state`); a fresh cache that restores the file and reads one new token; and
(`--reread-repeats` times, `--repeats` unless said; 0 for none) a fresh cache that reads all
`--tokens` and the new one (the re-read, in the passes `generate`'s prefill takes). Prints
one JSON line: the file's size and the best and median seconds of each, with the load average.
"""

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from engine.bench import fill_at_random
from engine.bundled import resolve_model_path
from engine.generation import prefill
from engine.loader import load_model
from engine.saved_state import SavedStates, identity_of


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--backend", default="cpu")
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--context", type=int, default=8192)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--fill", choices=("prefill", "random"), default="prefill")
    parser.add_argument("--kv-type", choices=("f16", "q8_0", "f32"), default="f16")
    parser.add_argument("--reread-repeats", type=int, default=None, help="default --repeats; 0: restore only")
    args = parser.parse_args()
    reread_repeats = args.repeats if args.reread_repeats is None else args.reread_repeats
    loaded = load_model(resolve_model_path(args.model), args.backend, threads=args.threads, kv_type=args.kv_type)
    vocab = loaded.config.vocab_size
    conversation = [int(t) for t in np.random.default_rng(0).integers(0, vocab, size=args.tokens + 1)]
    identity = identity_of(loaded.path, loaded.model)
    with tempfile.TemporaryDirectory() as folder:
        states = SavedStates(Path(folder), cap_bytes=1 << 40)
        cache = loaded.new_cache(args.context)
        if args.fill == "random":
            fill_at_random(cache, conversation[:-1])
        else:
            prefill(loaded.model, cache, conversation[:-1])

        def save() -> float:
            started = time.perf_counter()
            states.save("bench", cache, identity)
            return time.perf_counter() - started

        def restore() -> float:
            cache = loaded.new_cache(args.context)
            started = time.perf_counter()
            assert states.restore("bench", cache, conversation, identity).tokens == args.tokens
            prefill(loaded.model, cache, conversation[args.tokens :])
            return time.perf_counter() - started

        def reread() -> float:
            cache = loaded.new_cache(args.context)
            started = time.perf_counter()
            prefill(loaded.model, cache, conversation)
            return time.perf_counter() - started

        times: dict[str, list[float]] = {"save": [], "restore": [], "reread": []}
        for i in range(args.repeats):
            times["save"].append(save())
            times["restore"].append(restore())
            if i < reread_repeats:
                times["reread"].append(reread())
        size = states.path("bench").stat().st_size
    times = {way: t for way, t in times.items() if t}
    result = {
        "model": loaded.path.name,
        "backend": loaded.backend.name,
        "tokens": args.tokens,
        "context": args.context,
        "kv_type": loaded.model.kv_type,
        "fill": args.fill,
        "file_mb": round(size / 1e6, 1),
        **{f"{way}_best_s": round(min(t), 3) for way, t in times.items()},
        **{f"{way}_median_s": round(statistics.median(t), 3) for way, t in times.items()},
        "load_average": round(os.getloadavg()[0], 2),
    }
    print(json.dumps(result))
    loaded.close()


if __name__ == "__main__":
    main()
