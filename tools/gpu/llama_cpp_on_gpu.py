"""The peer's figures on the GPU: tools/bench/bench_llama_cpp.py with every layer offloaded to CUDA.

    python tools/gpu/llama_cpp_on_gpu.py MODEL.gguf [bench_llama_cpp's options]

Needs a CUDA build of llama-cpp-python. Prints bench_llama_cpp's JSON with the `model` (file
name) and `backend` keys of `python -m engine bench`, for tools/gpu/gpu_table.py.
"""

import contextlib
import io
import json
import runpy
import sys
from pathlib import Path

import llama_cpp

BENCH = Path(__file__).resolve().parents[1] / "bench" / "bench_llama_cpp.py"


def main() -> None:
    """Run bench_llama_cpp.py with `n_gpu_layers=-1` and print its figures, labelled."""
    load = llama_cpp.Llama.__init__

    def on_gpu(self, *args, **kwargs) -> None:
        load(self, *args, **{**kwargs, "n_gpu_layers": -1})

    llama_cpp.Llama.__init__ = on_gpu
    sys.argv = [str(BENCH), *sys.argv[1:], "--json"]
    sys.path.insert(0, str(BENCH.parent))
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        runpy.run_path(str(BENCH), run_name="__main__")
    figures = json.loads(printed.getvalue().splitlines()[-1])
    print(json.dumps({"model": Path(sys.argv[1]).name, "backend": "llama.cpp (CUDA)", **figures}))


if __name__ == "__main__":
    main()
