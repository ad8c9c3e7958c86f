"""GGUFFile on well-formed files: metadata as plain values, tensors as views of the map."""

import mmap

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFReader, GGUFWriter, quants

from engine.bundled import bundled_model
from engine.errors import ModelFileError
from engine.gguf_file import GGUFFile, open_gguf
from tests.gguf_factory import write_tiny_model


@pytest.fixture
def known_file(tmp_path):
    """A file whose every value and tensor byte the test knows independently."""
    rng = np.random.default_rng(1)
    arrays = {
        "w.f32": rng.standard_normal((3, 8)).astype(np.float32),  # (rows, cols)
        "w.f16": rng.standard_normal((5,)).astype(np.float16),
        "w.q8": quants.quantize(rng.standard_normal((4, 64)).astype(np.float32), GGMLQuantizationType.Q8_0),
    }
    writer = GGUFWriter(tmp_path / "known.gguf", "llama")
    writer.add_uint32("llama.block_count", 7)
    writer.add_float32("llama.rope.freq_base", 0.5)
    writer.add_bool("flag", True)
    writer.add_string("general.name", "Known")
    writer.add_array("names", ["a", "bé", "ccc"])
    writer.add_array("numbers", [3, -1, 4])
    writer.add_int64("big", -(2**40))
    for name, array in arrays.items():
        writer.add_tensor(name, array, raw_dtype=GGMLQuantizationType.Q8_0 if name == "w.q8" else None)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return tmp_path / "known.gguf", arrays


def test_metadata_are_plain_python_values(known_file):
    path, _ = known_file
    f = open_gguf(path)
    assert f.version == 3
    assert f.architecture == "llama"
    assert f.metadata["llama.block_count"] == 7 and type(f.metadata["llama.block_count"]) is int
    assert f.metadata["llama.rope.freq_base"] == 0.5 and type(f.metadata["llama.rope.freq_base"]) is float
    assert f.metadata["flag"] is True
    assert f.metadata["general.name"] == "Known"
    assert f.metadata["names"] == ["a", "bé", "ccc"]
    assert f.metadata["numbers"] == [3, -1, 4]
    assert f.metadata["big"] == -(2**40)
    assert not any(key.startswith("GGUF.") for key in f.metadata)


def test_get_and_arch_key(known_file):
    path, _ = known_file
    f = open_gguf(path)
    assert f.get("general.name") == "Known"
    assert f.get("missing.key", 12) == 12
    assert f.arch_key("block_count") == 7
    assert f.arch_key("context_length", 4096) == 4096
    assert f.arch_key("context_length", None) is None
    with pytest.raises(ModelFileError, match=r"llama\.context_length") as caught:
        f.arch_key("context_length")
    assert "known.gguf" in str(caught.value)


def test_tensors_are_exact_read_only_views_in_file_order(known_file):
    path, arrays = known_file
    f = open_gguf(path)
    assert list(f.tensors) == ["w.f32", "w.f16", "w.q8"]
    f32, f16, q8 = f.tensors.values()
    assert (f32.type_name, f32.shape, f32.n_elements, f32.n_bytes) == ("F32", (3, 8), 24, 96)
    assert (f16.type_name, f16.shape, f16.n_elements, f16.n_bytes) == ("F16", (5,), 5, 10)
    # Q8_0: 4 rows of 64 weights, two 34-byte blocks per row.
    assert (q8.type_name, q8.ggml_type, q8.shape, q8.n_elements, q8.n_bytes) == ("Q8_0", 8, (4, 64), 256, 4 * 2 * 34)
    for info in f.tensors.values():
        assert info.data.dtype == np.uint8 and info.data.ndim == 1
        assert info.data.tobytes() == arrays[info.name].tobytes()
        assert not info.data.flags.writeable
        assert not info.data.flags.owndata


def test_tensor_data_lives_in_the_memory_map(known_file):
    path, _ = known_file
    info = open_gguf(path).tensors["w.f32"]
    base = info.data
    while isinstance(base, np.ndarray):
        base = base.base
    if isinstance(base, memoryview):  # np.frombuffer over the map
        base = base.obj
    assert isinstance(base, mmap.mmap)


def test_close_and_context_manager(known_file):
    path, _ = known_file
    with GGUFFile(path) as f:
        view = f.tensors["w.f16"].data
    assert f.tensors == {}
    assert view.view(np.float16).shape == (5,)  # views handed out earlier stay valid


def test_tiny_model_round_trips(tmp_path):
    path = write_tiny_model(tmp_path / "tiny.gguf", arch="qwen3", n_layers=3, vocab=300)
    f = open_gguf(path)
    assert f.architecture == "qwen3"
    assert f.arch_key("block_count") == 3
    assert len(f.metadata["tokenizer.ggml.tokens"]) == 300
    assert f.tensors["token_embd.weight"].shape == (300, 64)
    assert f.tensors["blk.2.attn_q.weight"].shape == (4 * 16, 64)  # (n_out, n_in)
    assert f.tensors["blk.0.ffn_down.weight"].shape == (64, 128)


def test_real_smollm2_file_opens_as_views():
    f = open_gguf(bundled_model("smollm2").path)
    assert f.architecture == "llama"
    assert len(f.tensors) == 272  # 30 layers x 9 tensors + token_embd + output_norm
    embedding = f.tensors["token_embd.weight"]
    assert embedding.type_name == "Q8_0"
    assert embedding.shape == (49152, 576)
    assert embedding.n_bytes == 49152 * 576 // 32 * 34
    assert f.tensors["blk.0.ffn_down.weight"].type_name == "Q4_1"
    assert f.tensors["blk.0.ffn_down.weight"].shape == (576, 1536)
    assert f.metadata["tokenizer.ggml.model"] == "gpt2"
    assert len(f.metadata["tokenizer.ggml.tokens"]) == 49152


@pytest.mark.parametrize("model", ["smollm2", "gemma3", "tests/fixtures/models/tiny-qwen3-q1_0.gguf"])
def test_every_value_and_tensor_matches_gguf_py_reader(model):
    """gguf-py's GGUFReader is the independent reference for the whole header."""
    path = bundled_model(model).path if "/" not in model else model
    ours, theirs = open_gguf(path), GGUFReader(path)
    reference = {key: field.contents() for key, field in theirs.fields.items() if not key.startswith("GGUF.")}
    assert ours.metadata.keys() == reference.keys()
    for key, value in reference.items():
        assert ours.metadata[key] == value, key
        assert type(ours.metadata[key]) is type(value), key
    assert ours.version == theirs.fields["GGUF.version"].contents()
    assert list(ours.tensors) == [t.name for t in theirs.tensors]
    for t in theirs.tensors:
        info = ours.tensors[t.name]
        assert info.ggml_type == int(t.tensor_type) and info.shape == tuple(reversed(t.shape.tolist()))
        start = info.data.__array_interface__["data"][0] - ours.tensors[theirs.tensors[0].name].data.__array_interface__["data"][0]
        assert start == t.data_offset - theirs.tensors[0].data_offset and info.n_bytes == t.n_bytes


def test_a_split_model_opens_from_its_first_part(tmp_path):
    from engine.loader import load_model

    whole = write_tiny_model(tmp_path / "whole.gguf", arch="qwen3")
    (tmp_path / "parts").mkdir()
    write_tiny_model(tmp_path / "parts" / "m.gguf", arch="qwen3", split_max_tensors=10)  # as gguf-split writes
    first = tmp_path / "parts" / "m-00001-of-00003.gguf"
    with open_gguf(first) as split, open_gguf(whole) as one:
        assert [p.name for p in split.parts] == [f"m-0000{k}-of-00003.gguf" for k in (1, 2, 3)]
        assert split.tensors.keys() == one.tensors.keys()
        assert split.size == sum(p.stat().st_size for p in split.parts)
    logits = []
    for path in (whole, first):
        loaded = load_model(path, backend="numpy")
        try:
            logits.append(loaded.model.forward([5, 6, 7], 0, loaded.new_cache(8).storage))
        finally:
            loaded.close()
    np.testing.assert_array_equal(*logits)


def test_a_split_model_with_a_part_missing_or_opened_from_another_part_is_refused(tmp_path):
    write_tiny_model(tmp_path / "m.gguf", arch="qwen3", split_max_tensors=10)
    with pytest.raises(ModelFileError, match=r"m-00002-of-00003\.gguf.*not the first part.*-00001-of-"):
        open_gguf(tmp_path / "m-00002-of-00003.gguf")
    (tmp_path / "m-00003-of-00003.gguf").unlink()
    with pytest.raises(ModelFileError, match=r"its part m-00003-of-00003\.gguf is missing.*every part"):
        open_gguf(tmp_path / "m-00001-of-00003.gguf")
