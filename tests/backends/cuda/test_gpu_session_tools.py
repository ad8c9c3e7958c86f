"""The GPU session's tools (tools/gpu/), checked without a GPU: the scripts parse, the benchmark's
models have the bundled models' tensors, the table counts the bytes a token reads, and PyCUDA
built here loads against a stub driver and fails the way a machine without a GPU does.

The session itself: `CHECK_DRY_RUN=1 bash tools/gpu/check.sh` goes as far as it can here.
"""

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from engine.gguf_file import open_gguf
from tests.gguf_factory import write_tiny_model
from tools.gpu.gpu_table import bytes_per_token, table
from tools.gpu.make_shapes import SHAPES, tensor_plan

REPO = Path(__file__).resolve().parents[3]
SCRIPTS = sorted((REPO / "tools" / "gpu").glob("*.sh"))


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda path: path.name)
def test_script_parses(script: Path):
    subprocess.run(["bash", "-n", str(script)], check=True)


@pytest.mark.parametrize(("shape", "bundled"), [("smollm2-135m", "smollm2"), ("gemma3-270m", "gemma3")])
def test_shapes_have_the_bundled_models_tensors(shape: str, bundled: str):
    from engine.bundled import bundled_models

    paths = {model.key: model.path for model in bundled_models() if model.path.exists()}
    if bundled not in paths:
        pytest.skip(f"the bundled {bundled} model is not installed")
    with open_gguf(paths[bundled]) as model:
        real = {name: (tensor.ggml_type, tensor.shape) for name, tensor in model.tensors.items()}
    ours = {name: (int(qtype), dims) for name, dims, qtype in tensor_plan(SHAPES[shape])}
    assert ours == real


def test_bytes_per_token_by_hand(tmp_path: Path):
    # llama, untied: 2 layers of F32 weights, d_model 64, 4 heads of 16 over 2 KV heads, FFN 128, vocab 288.
    path = write_tiny_model(tmp_path / "tiny.gguf", arch="llama", n_layers=2, d_model=64, n_heads=4, n_kv_heads=2,
                            head_dim=16, d_ff=128, vocab=288)  # fmt: skip
    layer = 64 + 64 * 64 + 32 * 64 + 32 * 64 + 64 * 64 + 64 + 3 * 128 * 64  # norms, q, k, v, o, norm, gate/up/down
    weights = 4 * (2 * layer + 64 + 288 * 64)  # + output norm and output; the embeddings give one row
    kv = 2 * 2 * 2 * (16 + 16) * 10  # f16, layers, KV heads, key + value lengths, 10 positions
    assert bytes_per_token(path, 10) == weights + kv

    run = {"model": "tiny.gguf", "backend": "cuda", "prompt_tokens": 8, "gen_tokens": 4, "prefill_tok_s": 1000.0,
           "decode_tok_s": 2000.0}  # fmt: skip
    row = table([run], traffic_gb_s=1.0, models=tmp_path).splitlines()[-1]
    per_token = bytes_per_token(path, 8 + 4 / 2)
    assert row == (
        f"| tiny.gguf | cuda | 1,000 | 2,000.0 | {per_token / 1e6:.1f} | {per_token * 2000 / 1e9:.0f} "
        f"| {100 * per_token * 2000 / 1e9:.0f}% |"
    )


def test_pycuda_against_a_stub_driver(tmp_path: Path):
    """PyCudaDevice with PyCUDA built here and a driver that finds no GPU: a BackendError saying so."""
    try:
        import nvidia.cuda_runtime
    except ImportError:
        pytest.skip("no cuda.h here (pip install nvidia-cuda-runtime-cu12)")
    if shutil.which("gcc") is None or importlib.util.find_spec("pycuda") is None:
        pytest.skip("PyCUDA (tools/gpu/build_pycuda_wheel.sh) or gcc is not installed")
    include = Path(next(iter(nvidia.cuda_runtime.__path__))) / "include"
    subprocess.run(["bash", str(REPO / "tools/gpu/make_libcuda_stub.sh"), str(include), str(tmp_path)], check=True)
    script = (
        "import json\n"
        "from backends.cuda.pycuda_device import PyCudaDevice\n"
        "from backends.errors import BackendError\n"
        "try:\n    PyCudaDevice()\nexcept BackendError as exc:\n    print(json.dumps(str(exc)))\n"
    )
    environment = {**os.environ, "LD_LIBRARY_PATH": str(tmp_path), "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", script], env=environment, capture_output=True, text=True, check=True)
    message = json.loads(done.stdout)
    assert message.startswith("cuda: starting GPU 0 failed: cuInit failed: ") and "no CUDA-capable device" in message
