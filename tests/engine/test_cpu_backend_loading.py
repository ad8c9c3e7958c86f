"""Choosing and loading the native CPU backend: selection, fallback, damaged tensors,
types converted at load, and the command line."""

import json
import shutil

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType

from backends import cpu_backend, cpu_native, selection
from backends.errors import BackendUnavailable
from engine.bundled import resolve_model_path
from engine.errors import ModelFileError
from engine.loader import load_model
from tests.backends.test_cpu_kernels import random_matrix
from tests.engine.parity_models import FIXTURES
from tests.engine.test_cli import engine
from tests.gguf_factory import write_tiny_model

TINY = FIXTURES / "tiny-qwen3-f32.gguf"
# the types issue 23 gave kernels: each loads in place
IN_PLACE_TYPES = ["Q2_K", "Q3_K", "TQ2_0", "TQ1_0", "IQ4_NL", "IQ4_XS", "IQ3_XXS", "IQ3_S", "IQ2_XXS", "IQ2_XS",
                  "IQ2_S", "IQ1_S", "IQ1_M"]


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


def nvfp4_blocks(values: np.ndarray, qtype: GGMLQuantizationType) -> np.ndarray:
    """Random NVFP4 blocks for `values`' shape (gguf-py cannot quantize NVFP4): four E4M3
    scales of 1/16 (byte 0x20), then random 4-bit codes."""
    rows, cols = values.shape
    blocks = np.random.default_rng(cols).integers(0, 256, size=(rows * cols // 64, 36), dtype=np.uint8)
    blocks[:, :4] = 0x20
    return blocks.reshape(rows, -1)


def test_a_type_without_a_kernel_is_converted_once_and_the_load_says_so(tmp_path):
    assert int(GGMLQuantizationType.NVFP4) not in cpu_native.load().NATIVE_TYPES
    path = write_tiny_model(tmp_path / "nvfp4.gguf", arch="qwen3", d_model=256, n_heads=4, head_dim=64, d_ff=256,
                            tensor_type=GGMLQuantizationType.NVFP4, quantize=nvfp4_blocks)
    cpu, reference = load_model(path, "cpu"), load_model(path, "numpy")
    try:
        assert any("NVFP4" in note and "converted to Q8_0" in note for note in cpu.load_notes)
        tokens = np.array([5, 80, 200, 33])
        ours = cpu.model.forward(tokens, 0, cpu.new_cache(8).storage)
        theirs = reference.model.forward(tokens, 0, reference.new_cache(8).storage)
        assert int(ours.argmax()) == int(theirs.argmax())
        np.testing.assert_allclose(ours, theirs, atol=0.02 * float(np.ptp(theirs)))
    finally:
        cpu.close()
        reference.close()


# Of the logits' range. The ternary types' table lookups take the activations as 11-bit codes
# (cpu_kernels/tq_tiles.c), 32 times coarser than the 16-bit codes of the other products; Q2_K's,
# Q3_K's and most IQ types' products take 8-bit codes (cpu_kernels/codes8_dots.c), 8 times
# coarser again (these random weights give 0.6% and 1.1% of the range for Q2_K and Q3_K;
# perplexity on real models moves less than 0.6%: tests/engine/test_requantized_perplexity.py).
CODES8_TYPES = ("Q2_K", "Q3_K", "IQ4_XS", "IQ3_XXS", "IQ3_S", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ1_S", "IQ1_M")
LOGIT_TOLERANCE = {"TQ1_0": 2e-3, "TQ2_0": 2e-3} | dict.fromkeys(CODES8_TYPES, 2e-2)


@pytest.mark.parametrize("qtype", [GGMLQuantizationType[name] for name in IN_PLACE_TYPES])
def test_a_type_with_a_kernel_loads_in_place_without_a_note(qtype, tmp_path):
    """Every matrix stays in the file's blocks (no conversion, no note), and the model's
    logits are the reference backend's on the same blocks."""
    def blocks(values: np.ndarray, qtype: GGMLQuantizationType) -> np.ndarray:
        return random_matrix(qtype, *values.shape, np.random.default_rng(values.size))

    path = write_tiny_model(tmp_path / f"{qtype.name}.gguf", arch="qwen3", d_model=256, n_heads=4, head_dim=64,
                            d_ff=256, tensor_type=qtype, quantize=blocks)
    cpu, reference = load_model(path, "cpu"), load_model(path, "numpy")
    try:
        assert cpu.load_notes == []
        tokens = np.array([5, 80, 200, 33])
        ours = cpu.model.forward(tokens, 0, cpu.new_cache(8).storage)
        theirs = reference.model.forward(tokens, 0, reference.new_cache(8).storage)
        np.testing.assert_allclose(ours, theirs, atol=LOGIT_TOLERANCE.get(qtype.name, 1e-3) * float(np.ptp(theirs)))
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


def test_a_tied_output_head_gets_its_row_tiles_at_load():
    """SmolLM2's output head is its Q8_0 token embedding (tied): its row tiles (the 32-weight
    types' product form, cpu_kernels/row_tiles.c) are made at load, not in the first answer's
    prefill, and its embedding lookups read them too."""
    loaded = load_model(resolve_model_path("smollm2"), "cpu")
    try:
        model = loaded.model
        assert model.output is model.token_embd and model.output.ggml_type == GGMLQuantizationType.Q8_0
        assert model.output.tiles is not None and len(model.output.tiles) == model.output.raw.nbytes
        assert cpu_backend._file_backed(model.output.raw)  # so its blocks are unmapped, not evicted
        logits = model.forward(np.array([1, 2, 3]), 0, loaded.new_cache(8).storage)
        assert np.all(np.isfinite(logits))
    finally:
        loaded.close()
