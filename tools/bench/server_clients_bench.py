"""Aggregate decode speed of the local server with 1, 2 and 4 concurrent clients, batched and not.

    python tools/bench/server_clients_bench.py [--model smollm2] [--backend auto] [--tokens 64] [--repeats 2]

Loads the model once and serves it on loopback twice: one server decodes up to four
requests together in one batched step (`--max-batch 4`, the default), the other one at a
time (`--max-batch 1`: requests take turns). For each client count, interleaved between
the two servers, `--repeats` times, every client asks for `--tokens` tokens at once; prints
the tokens all of them generated over the wall time, and the load average, as JSON lines.
"""

import argparse
import json
import os
import threading
import time

import openai

from engine.bundled import resolve_model_path
from engine.loader import load_model
from engine.server.app import ServerConfig, ServerState
from engine.server.completions import ServedModel
from engine.server.scheduler import Scheduler
from engine.server.serve import BackgroundServer


def round_of(url: str, clients: int, tokens: int) -> dict:
    counts = []

    def one(index: int) -> None:
        client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=600)
        reply = client.completions.create(model="m", prompt=f"Once upon a time, story {index}:", max_tokens=tokens,
                                          temperature=0.8, seed=index)
        counts.append(reply.usage.completion_tokens)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(clients)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - started
    return {"clients": clients, "tokens": sum(counts), "seconds": round(wall, 3),
            "aggregate_tok_s": round(sum(counts) / wall, 1), "load_average": os.getloadavg()[0]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--backend", default="auto")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    loaded = load_model(resolve_model_path(args.model), args.backend)
    schedulers = {batch: Scheduler(max_batch=batch) for batch in (4, 1)}  # one runs at a time: they share the model
    servers = {batch: BackgroundServer(ServerState(ServedModel(loaded, scheduler, "m", 1024)),
                                       ServerConfig(port=0)).start()
               for batch, scheduler in schedulers.items()}
    try:
        for server in servers.values():
            round_of(server.url, 1, 8)  # warm-up
        for _ in range(args.repeats):
            for clients in (1, 2, 4):
                for batch, server in servers.items():
                    figures = round_of(server.url, clients, args.tokens)
                    print(json.dumps({"backend": loaded.backend.name, "max_batch": batch, **figures}), flush=True)
    finally:
        for server in servers.values():
            server.stop()
        for scheduler in schedulers.values():
            scheduler.close()
        loaded.close()


if __name__ == "__main__":
    main()
