"""What the model picker says about a file: read from its header, checked against gguf-py."""

from pathlib import Path

import gguf
import pytest

from app.model_library import LibraryEntry, library_entries
from backends.memory import RUNTIME_OVERHEAD
from engine.bundled import bundled_model
from engine.errors import ModelFileError, UnsupportedModelError
from engine.model_info import ModelInfo, format_bytes, format_parameters, read_model_info
from tests.gguf_factory import write_mamba_model, write_tiny_model


def test_smollm2_is_described_as_its_header_says():
    path = bundled_model("smollm2").path
    info = read_model_info(path, "SmolLM2")
    reader = gguf.GGUFReader(path)  # the independent count
    assert info.parameters == sum(int(t.n_elements) for t in reader.tensors)
    assert info.weight_bytes_f32 == 4 * sum(int(t.n_elements) for t in reader.tensors if len(t.shape) >= 2)
    assert (info.name, info.architecture, info.quantization) == ("SmolLM2", "llama", "Q4_1")
    assert info.context_length == 8192 and info.file_size == path.stat().st_size
    # 30 layers x 3 KV heads x (64 + 64) dims x 4 bytes per position
    assert info.kv_bytes_per_token == 30 * 3 * 128 * 4


def test_a_file_without_a_file_type_is_named_by_its_dominant_weight_type(tmp_path):
    path = write_tiny_model(tmp_path / "tiny.gguf", tensor_type=gguf.GGMLQuantizationType.Q8_0)
    info = read_model_info(path)
    assert info.quantization == "Q8_0" and info.architecture == "qwen3"


def test_quantization_comes_from_the_tensors_not_a_stale_file_type(tmp_path):
    stale = write_tiny_model(tmp_path / "requantized.gguf", **{"general.file_type": int(gguf.LlamaFileType.MOSTLY_Q4_1)})
    assert read_model_info(stale).quantization == "F32"  # every weight is F32, whatever the header says
    agreeing = write_tiny_model(tmp_path / "q8.gguf", tensor_type=gguf.GGMLQuantizationType.Q8_0,
                                **{"general.file_type": int(gguf.LlamaFileType.MOSTLY_Q8_0)})
    assert read_model_info(agreeing).quantization == "Q8_0"


def test_a_k_quant_mix_keeps_its_name_when_the_tensors_agree():
    path = bundled_model("gemma3").path
    types = {t.tensor_type.name for t in gguf.GGUFReader(path).tensors if t.name.startswith("blk.")}
    assert "Q4_K" in types  # the independent reading: a Q4_K_M mix
    assert read_model_info(path).quantization == "Q4_K_M"


def test_bad_and_unsupported_files_raise_engine_errors(tmp_path):
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"not a model")
    with pytest.raises(ModelFileError, match="broken.gguf"):
        read_model_info(broken)
    with pytest.raises(UnsupportedModelError, match="mamba"):
        read_model_info(write_mamba_model(tmp_path / "mamba.gguf"))


def made_up_info(file_size: int) -> ModelInfo:
    return ModelInfo(path=Path("m.gguf"), name="m", architecture="llama", parameters=250_000_000,
                     quantization="Q4_0", file_size=file_size, context_length=2048,
                     weight_bytes_f32=1_000_000_000, kv_bytes_per_token=100_000)


@pytest.mark.parametrize("available, fits, phrase", [
    (4_000_000_000, True, "needs 1.1 GB of 4 GB available"),  # 1e9 + 1000 x 1e5 = 1.1e9 <= half of 4e9
    (1_500_000_000, False, "will run, slowly"),  # not cached whole, but file + KV fit
    (300_000_000, False, "will not fit"),  # 250 MB file + 100 MB KV > 300 MB
])
def test_memory_verdicts(available, fits, phrase):
    got_fits, text = made_up_info(file_size=250_000_000).memory_verdict(1000, available, "numpy", "f32")
    assert got_fits == fits and phrase in text


@pytest.mark.parametrize("available, fits", [
    (800_000_000, True),  # 250 MB file + 100 MB KV + 256 MiB overhead = 618 MB
    (600_000_000, False),
])
def test_memory_verdict_of_the_cpu_backend_counts_the_file_not_float32_weights(available, fits):
    info = made_up_info(file_size=250_000_000)
    assert info.memory_needed(1000, "cpu", "f32") == 250_000_000 + 1000 * 100_000 + RUNTIME_OVERHEAD
    got_fits, text = info.memory_verdict(1000, available, "cpu", "f32")
    assert got_fits == fits and ("will not fit" in text) == (not fits) and "slowly" not in text


def test_kv_is_counted_up_to_the_model_context_only():
    info = made_up_info(file_size=1)
    assert info.memory_needed(100_000, "numpy", "f32") == 1_000_000_000 + 2048 * 100_000
    assert info.memory_needed(100_000) == 1_000_000_000 + 2048 * 50_000  # float16 by default: half the bytes
    assert info.memory_needed(100_000, "numpy", "q8_0") == 1_000_000_000 + 2048 * (100_000 * 34 // 128)


def test_library_lists_bundled_then_folder_then_added_once_each(tmp_path):
    folder = tmp_path / "models"
    folder.mkdir()
    local = write_tiny_model(folder / "local.gguf")
    missing = tmp_path / "gone.gguf"
    entries = library_entries(folder, [(str(local), "again"), (str(missing), "Gone")])
    bundled = [e for e in entries if e.bundled]
    assert [e.path.name for e in bundled] == ["SmolLM2-135M-Instruct.Q4_1.gguf", "gemma-3-270m-q4_k_m.gguf"]
    assert entries[len(bundled):] == [LibraryEntry(Path(local), "local"), LibraryEntry(missing, "Gone")]


@pytest.mark.parametrize("n, text", [(512, "512 B"), (98_362_432, "98.4 MB"), (1_072_392_704, "1.07 GB"),
                                     (253_113_024, "253 MB")])
def test_format_bytes(n, text):
    assert format_bytes(n) == text


def test_format_parameters():
    assert (format_parameters(134_515_008), format_parameters(8_030_000_000)) == ("135M", "8.0B")


def test_a_mixture_of_experts_says_how_much_of_it_a_token_reads(tmp_path):
    from engine.model_info import describe_parameters
    from tests.gguf_factory import N_EXPERTS, N_EXPERTS_USED

    info = read_model_info(write_tiny_model(tmp_path / "moe.gguf", arch="qwen3moe", n_layers=2))
    per_expert = 3 * 128 * 64  # gate, up (128 x 64) and down (64 x 128) of one expert, per layer
    idle = 2 * (N_EXPERTS - N_EXPERTS_USED) * per_expert
    assert info.active_parameters == info.parameters - idle
    assert describe_parameters(info).endswith(" active") and " MoE, " in describe_parameters(info)
    dense = read_model_info(write_tiny_model(tmp_path / "dense.gguf", arch="qwen3"))
    assert dense.active_parameters is None and "MoE" not in describe_parameters(dense)
