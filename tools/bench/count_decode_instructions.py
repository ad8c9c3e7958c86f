"""n decode steps of a bundled model on the cpu backend, one thread: a fixed workload for
callgrind, whose instruction counts do not depend on the machine's load (docs/benchmarks.md):

    PYTHONPATH=. SPRIG_CPU_TIER=avx2 valgrind --tool=callgrind --callgrind-out-file=n36.out \
        .venv/bin/python tools/bench/count_decode_instructions.py smollm2 36

(and again with 4 steps: the difference over 32 is one decode step).
"""
import sys

from engine.bundled import resolve_model_path
from engine.loader import load_model

model = load_model(resolve_model_path(sys.argv[1]), backend="cpu", threads=1)
cache = model.new_cache(256)
cache.feed(model.model, list(range(100, 164)))
step = model.model.decode_step(cache.storage)
for i in range(int(sys.argv[2])):
    step(5 + i, 64 + i)
print("ok", model.model.__module__)
