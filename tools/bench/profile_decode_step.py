"""Where a decode step's time goes on the native CPU backend, for docs/benchmarks.md.

    .venv/bin/python -m tools.bench.profile_decode_step smollm2 [--context 256] [--steps 64] [--tokens T]

It times, on the same filled KV cache:
- the compiled step (the op list recorded once and replayed in C, one call per token);
- with --tokens T > 1, also the compiled pass over T tokens with every token's logits (what
  speculative decoding's verification costs) and c(T), that pass's time over the step's;
- the forward pass over T tokens (1 by default) op by op from Python, and within it the time of each kind of op
  (each op's C call, timed around `native.run`), so that the rest is Python dispatch;
- the bytes one step reads (every weight matrix once, of a mixture the router and the used
  share of the experts, the token's embedding row, the KV cache so far) and the rate that
  makes against the machine's bandwidth.
"""

import argparse
import time
from collections import defaultdict

import numpy as np

from backends.base import Runner, Segment
from engine.bundled import resolve_model_path
from engine.loader import load_model

OP_NAMES = {"embed": "embedding", "linear": "matrix products", "rms_norm": "rms norm", "rope": "rope",
            "attention": "attention", "gated": "gated activation", "add": "residual add", "softcap": "soft-cap"}



class TimedNative:
    """The native module with `run` replaced by a timing wrapper; everything else passes through."""

    def __init__(self, native, run):
        self.native, self.run = native, run

    def __getattr__(self, name: str):
        return getattr(self.native, name)

def step_bytes(loaded, context: int) -> int:
    """Bytes one decode step reads: the matrices, one embedding row, the keys and values so far."""
    model, config = loaded.model, loaded.config
    weights = model.output.raw.nbytes
    for layer in model.layers:
        a, f = layer.mixer, layer.feed_forward
        weights += sum(w.raw.nbytes for w in (a.wq, a.wk, a.wv, a.wo))
        if hasattr(f, "routing"):  # a mixture: the router, and the used share of the experts' stacks
            stacks = sum(w.matrix.raw.nbytes for w in (f.gate, f.up, f.down))  # (cpu backend stacks)
            weights += f.router.raw.nbytes + stacks * f.routing.n_used // f.routing.n_experts
        else:
            weights += sum(w.raw.nbytes for w in (f.w_gate, f.w_up, f.w_down))
    embedding_row = model.token_embd.raw.nbytes // model.token_embd.rows
    kv = 4 * config.n_layers * config.n_kv_heads * (config.head_dim + config.value_head_dim) * context
    return weights + embedding_row + kv


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--tokens", type=int, default=1, help="tokens per pass, with all logits")
    args = parser.parse_args()
    tokens = args.tokens
    loaded = load_model(resolve_model_path(args.model), "cpu", threads=args.threads)
    cache = loaded.new_cache(args.context + args.steps + tokens + 4)
    prompt = np.random.default_rng(0).integers(0, loaded.config.vocab_size, size=args.context)
    cache.feed(loaded.model, prompt.tolist())
    step = loaded.model.decode_step(cache.storage)
    step(1, args.context)  # records and compiles
    started = time.perf_counter()
    for i in range(args.steps):
        step(1, args.context + i % 4)
    compiled = (time.perf_counter() - started) / args.steps
    if tokens > 1:
        draft = list(range(1, 1 + tokens))
        started = time.perf_counter()
        for _ in range(args.steps):
            cache.feed(loaded.model, draft, all_logits=True)
            cache.truncate(args.context)
        compiled_pass = (time.perf_counter() - started) / args.steps

    native, per_op = loaded.backend.native, defaultdict(float)
    run, op_name = native.run, {code: name for name, (code, _, _) in native.OPS.items()}

    def timed(op):
        t = time.perf_counter()
        run(op)
        per_op[op_name[op[0]]] += time.perf_counter() - t

    loaded.backend.native = TimedNative(native, timed)
    started = time.perf_counter()
    for i in range(args.steps):
        position = args.context + i % 4
        Runner(loaded.model.logits)(np.ones(tokens, dtype=np.int64), [Segment(cache.storage, position, tokens)], True)
    eager = (time.perf_counter() - started) / args.steps
    loaded.backend.native = native

    bytes_read = step_bytes(loaded, args.context)
    print(f"{loaded.path.name} on {loaded.backend.device_name}, context {args.context}")
    print(f"compiled step: {compiled * 1e3:.2f} ms ({1 / compiled:.1f} tok/s); "
          f"reads {bytes_read / 1e6:.1f} MB: {bytes_read / compiled / 1e9:.1f} GB/s")
    if tokens > 1:
        print(f"compiled pass over {tokens} tokens: {compiled_pass * 1e3:.2f} ms; c({tokens}) = {compiled_pass / compiled:.2f}")
    print(f"op by op from Python, {tokens} token(s) a pass: {eager * 1e3:.2f} ms")
    for name, seconds in sorted(per_op.items(), key=lambda kv: -kv[1]):
        print(f"  {OP_NAMES.get(name, name):18s} {seconds / args.steps * 1e3:7.3f} ms")
    print(f"  {'Python dispatch':18s} {(eager - sum(per_op.values()) / args.steps) * 1e3:7.3f} ms")


if __name__ == "__main__":
    main()
