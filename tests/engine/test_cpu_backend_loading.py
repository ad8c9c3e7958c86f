"""Choosing and loading the native CPU backend: selection, fallback, damaged tensors,
types converted at load, and the command line."""

import json
import shutil

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType

from backends import cpu_native, selection
from backends.errors import BackendUnavailable
from engine.errors import ModelFileError
from engine.loader import load_model
from tests.engine.parity_models import FIXTURES
from tests.engine.test_cli import engine
from tests.gguf_factory import write_tiny_model

TINY = FIXTURES / "tiny-qwen3-f32.gguf"


def test_auto_picks_the_cpu_backend_where_no_gpu_backend_applies():
    backend, reasons = selection.select("auto", threads=1)
    assert backend.name == "cpu" and backend.threads == 1
    assert any(r.startswith("cuda:") for r in reasons) and not any(r.startswith("cpu:") for r in reasons)


def test_without_the_extension_auto_falls_back_to_numpy_and_says_why(monkeypatch):
    monkeypatch.setattr(cpu_native, "_module", lambda tier: None)
    backend, reasons = selection.select("auto")
    assert backend.name == "numpy"
    assert any(r.startswith("cpu: the native kernels were not built") for r in reasons)
    with pytest.raises(BackendUnavailable, match="not built"):
        selection.select("cpu")


def test_a_damaged_scale_is_refused_at_load_with_the_tensor_named(tmp_path):
    path = write_tiny_model(tmp_path / "q8.gguf", arch="qwen3", tensor_type=GGMLQuantizationType.Q8_0)
    target = next(t for t in gguf.GGUFReader(path).tensors if t.name == "blk.1.ffn_up.weight")
    offset = int(target.data_offset) + 34 * 3  # the fp16 scale of the fourth Q8_0 block
    data = bytearray(path.read_bytes())
    data[offset:offset + 2] = np.float16(np.inf).tobytes()
    path.write_bytes(bytes(data))
    with pytest.raises(ModelFileError, match=r"blk\.1\.ffn_up\.weight has 1 blocks whose scale is infinite"):
        load_model(path, "cpu")
    load_model(path, "numpy").close()  # the reference backend reads it (and computes inf)


def test_a_type_without_a_kernel_is_converted_once_and_the_load_says_so(tmp_path):
    path = write_tiny_model(tmp_path / "tq2.gguf", arch="qwen3", d_model=256, n_heads=4, head_dim=64, d_ff=256,
                            tensor_type=GGMLQuantizationType.TQ2_0)
    cpu, reference = load_model(path, "cpu"), load_model(path, "numpy")
    try:
        assert any("TQ2_0" in note and "converted to Q8_0" in note for note in cpu.load_notes)
        tokens = np.array([5, 80, 200, 33])
        ours = cpu.model.forward(tokens, 0, cpu.new_cache(8).storage)
        theirs = reference.model.forward(tokens, 0, reference.new_cache(8).storage)
        assert int(ours.argmax()) == int(theirs.argmax())
        np.testing.assert_allclose(ours, theirs, atol=0.02 * float(np.ptp(theirs)))
    finally:
        cpu.close()
        reference.close()


def test_cli_generates_and_benches_on_the_cpu_backend(tmp_path):
    model = tmp_path / "tiny.gguf"
    shutil.copy(TINY, model)
    result = engine("generate", "--model", model, "--backend", "cpu", "--tokens", "5,6,7", "--max-tokens", "4",
                    "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["backend"] == "cpu"
    result = engine("bench", "--model", model, "--backend", "cpu", "--threads", "1", "--prompt-tokens", "16",
                    "--gen-tokens", "4", "--json")
    assert result.returncode == 0, result.stderr
    figures = json.loads(result.stdout)
    assert figures["backend"] == "cpu" and figures["device"].startswith("CPU (1 threads")
    assert figures["load_s"] > 0 and figures["rss_bytes"]["after_run"] > 0
