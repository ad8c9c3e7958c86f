"""Corrupt, truncated and hostile GGUF files: each must raise ModelFileError, quickly and cheaply.

Each case starts from a small valid file written by gguf-py's GGUFWriter and patches bytes
at offsets found by searching for the key or tensor name, following the GGUF layout:
a key/name is a u64 length then its bytes; a value is a u32 type then the value (an array:
u32 item type, u64 count, items); a tensor info is name, u32 n_dims, u64 dims, u32 type,
u64 offset.
"""

import mmap
import os
import struct
import tracemalloc

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFWriter, quants

from engine.models import read_config
from engine.errors import ModelFileError, UnsupportedModelError
from engine.gguf_file import open_gguf
from tests.gguf_factory import write_tiny_model

pytestmark = pytest.mark.timeout(120)

ABSURD = [2**63 - 1, 2**64 - 1, 2**40]
MAX_PEAK_BYTES = 2 << 20  # what Python may allocate while rejecting a file


def write_sample(path):
    """A small file with a value of every GGUF type, three tensor types and 64-byte alignment."""
    rng = np.random.default_rng(0)
    w = GGUFWriter(path, "llama")
    w.add_custom_alignment(64)
    w.add_uint8("k.u8", 7)
    w.add_int8("k.i8", -7)
    w.add_uint16("k.u16", 700)
    w.add_int16("k.i16", -700)
    w.add_uint32("k.u32", 70000)
    w.add_int32("k.i32", -70000)
    w.add_float32("k.f32", 0.25)
    w.add_bool("k.bool", True)
    w.add_uint64("k.u64", 2**40)
    w.add_int64("k.i64", -(2**40))
    w.add_float64("k.f64", 0.125)
    w.add_string("k.str", "hello")
    w.add_array("k.arr_i", [1, 2, 3])
    w.add_array("k.arr_s", ["a", "bc", "def"])
    w.add_tensor("t.one", rng.standard_normal((4, 8)).astype(np.float32))
    w.add_tensor("t.two", quants.quantize(rng.standard_normal((2, 64)).astype(np.float32), GGMLQuantizationType.Q8_0),
                 raw_dtype=GGMLQuantizationType.Q8_0)
    w.add_tensor("t.six", rng.standard_normal((3,)).astype(np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def sample(tmp_path_factory) -> bytes:
    return write_sample(tmp_path_factory.mktemp("sample") / "sample.gguf").read_bytes()


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> bytes:
    return write_tiny_model(tmp_path_factory.mktemp("tiny") / "tiny.gguf", arch="qwen3", n_layers=1).read_bytes()


def value_at(data: bytes, key: str) -> int:
    """Offset of the u32 value type that follows `key` (the key must occur once)."""
    needle = key.encode()
    assert data.count(needle) == 1, key
    return data.index(needle) + len(needle)


def patched(data: bytes, offset: int, fmt: str, value) -> bytes:
    out = bytearray(data)
    struct.pack_into(fmt, out, offset, value)
    return bytes(out)


def tensor_fields(data: bytes, name: str) -> dict[str, int]:
    """Offsets of the fields of tensor `name`'s info."""
    at = value_at(data, name)
    n_dims = struct.unpack_from("<I", data, at)[0]
    return {"name_len": at - len(name) - 8, "n_dims": at, "dims": at + 4,
            "type": at + 4 + 8 * n_dims, "offset": at + 8 + 8 * n_dims}


def expect_rejected(path, data: bytes, error=ModelFileError) -> str:
    """Write `data` to `path`, open it, and check it fails with `error`, cheaply; return the message."""
    path.write_bytes(data)
    tracemalloc.start()
    try:
        with pytest.raises(error) as caught:
            open_gguf(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < MAX_PEAK_BYTES
    message = str(caught.value)
    assert path.name in message
    return message


def test_sample_file_is_valid(tmp_path, sample):
    path = tmp_path / "ok.gguf"
    path.write_bytes(sample)
    f = open_gguf(path)
    assert list(f.tensors) == ["t.one", "t.two", "t.six"]
    assert f.metadata["k.arr_s"] == ["a", "bc", "def"] and f.metadata["general.alignment"] == 64


def test_bad_magic(tmp_path, sample):
    assert "magic" in expect_rejected(tmp_path / "m.gguf", b"GGUX" + sample[4:])


@pytest.mark.parametrize("version", [0, 1, 4, 0xFFFF, 2**32 - 1])
def test_unsupported_version(tmp_path, sample, version):
    message = expect_rejected(tmp_path / "v.gguf", patched(sample, 4, "<I", version), UnsupportedModelError)
    assert "version" in message


def test_big_endian_is_rejected_clearly(tmp_path, sample):
    message = expect_rejected(tmp_path / "be.gguf", patched(sample, 4, ">I", 3), UnsupportedModelError)
    assert "big-endian" in message


@pytest.mark.parametrize("count", ABSURD + [2**16 + 1, 1000])
@pytest.mark.parametrize("field", ["tensor count", "metadata count"])
def test_absurd_counts(tmp_path, sample, field, count):
    offset = 8 if field == "tensor count" else 16
    expect_rejected(tmp_path / "c.gguf", patched(sample, offset, "<Q", count))


@pytest.mark.parametrize("length", ABSURD + [1000])
@pytest.mark.parametrize("where", ["first key", "string value", "tensor name"])
def test_absurd_string_lengths(tmp_path, sample, where, length):
    offset = {
        "first key": 24,
        "string value": value_at(sample, "k.str") + 4,
        "tensor name": tensor_fields(sample, "t.two")["name_len"],
    }[where]
    expect_rejected(tmp_path / "s.gguf", patched(sample, offset, "<Q", length))


@pytest.mark.parametrize("length", ABSURD + [2**20, 2**22 + 1])
@pytest.mark.parametrize("key", ["k.arr_i", "k.arr_s"])
def test_absurd_array_lengths(tmp_path, sample, key, length):
    expect_rejected(tmp_path / "a.gguf", patched(sample, value_at(sample, key) + 8, "<Q", length))


@pytest.mark.parametrize("value_type", [13, 255, 2**32 - 1])
def test_unknown_value_type(tmp_path, sample, value_type):
    message = expect_rejected(tmp_path / "t.gguf", patched(sample, value_at(sample, "k.u8"), "<I", value_type))
    assert "k.u8" in message


@pytest.mark.parametrize("item_type", [13, 2**32 - 1, int(gguf.GGUFValueType.ARRAY)])
def test_bad_array_item_type(tmp_path, sample, item_type):
    message = expect_rejected(tmp_path / "i.gguf", patched(sample, value_at(sample, "k.arr_i") + 4, "<I", item_type))
    assert "k.arr_i" in message


@pytest.mark.parametrize("ggml_type", [4, 5, 99, 2**32 - 1])  # 4, 5: Q4_2, Q4_3, removed from ggml
def test_unknown_tensor_type(tmp_path, sample, ggml_type):
    data = patched(sample, tensor_fields(sample, "t.one")["type"], "<I", ggml_type)
    assert "t.one" in expect_rejected(tmp_path / "u.gguf", data, UnsupportedModelError)


@pytest.mark.parametrize("n_dims", [0, 5, 2**31])
def test_bad_dimension_count(tmp_path, sample, n_dims):
    expect_rejected(tmp_path / "d.gguf", patched(sample, tensor_fields(sample, "t.one")["n_dims"], "<I", n_dims))


@pytest.mark.parametrize("dims", [(0, 4), (8, 0), (2**40, 4), (8, 2**40), (2**32, 2**32), (2**63, 1), (2**64 - 1, 1)])
def test_impossible_shapes(tmp_path, sample, dims):
    at = tensor_fields(sample, "t.one")["dims"]
    expect_rejected(tmp_path / "s.gguf", patched(patched(sample, at, "<Q", dims[0]), at + 8, "<Q", dims[1]))


def test_rows_must_be_whole_blocks(tmp_path, sample):
    at = tensor_fields(sample, "t.two")["dims"]  # Q8_0 rows of 64 weights: two blocks of 32
    assert "t.two" in expect_rejected(tmp_path / "b.gguf", patched(sample, at, "<Q", 48))


@pytest.mark.parametrize("offset", [2**40, 2**64 - 64, 64 * 1000])
def test_tensor_offset_past_end(tmp_path, sample, offset):
    data = patched(sample, tensor_fields(sample, "t.six")["offset"], "<Q", offset)
    assert "t.six" in expect_rejected(tmp_path / "o.gguf", data)


def test_misaligned_offset(tmp_path, sample):
    at = tensor_fields(sample, "t.two")["offset"]
    start = struct.unpack_from("<Q", sample, at)[0]
    assert "t.two" in expect_rejected(tmp_path / "a.gguf", patched(sample, at, "<Q", start + 4))


def test_overlapping_tensors(tmp_path, sample):
    data = patched(sample, tensor_fields(sample, "t.two")["offset"], "<Q", 0)  # on top of t.one
    assert "overlaps" in expect_rejected(tmp_path / "o.gguf", data)


def test_duplicate_tensor_names(tmp_path, sample):
    at = value_at(sample, "t.six") - 5
    data = sample[:at] + b"t.two" + sample[at + 5:]
    assert "t.two" in expect_rejected(tmp_path / "n.gguf", data)


def test_duplicate_keys(tmp_path, sample):
    at = value_at(sample, "k.i8") - 4
    data = sample[:at] + b"k.u8" + sample[at + 4:]
    assert "k.u8" in expect_rejected(tmp_path / "k.gguf", data)


@pytest.mark.parametrize("change", ["zero", "not a power of two", "float type", "too large"])
def test_bad_alignment(tmp_path, sample, change):
    at = value_at(sample, "general.alignment")
    data = {
        "zero": patched(sample, at + 4, "<I", 0),
        "not a power of two": patched(sample, at + 4, "<I", 48),
        "float type": patched(sample, at, "<I", int(gguf.GGUFValueType.FLOAT32)),
        "too large": patched(sample, at + 4, "<I", 2**31),
    }[change]
    expect_rejected(tmp_path / "al.gguf", data)


def test_invalid_utf8_in_a_key(tmp_path, sample):
    at = value_at(sample, "k.f64") - 1
    assert "UTF-8" in expect_rejected(tmp_path / "u.gguf", sample[:at] + b"\xff" + sample[at + 1:])


def test_invalid_utf8_in_a_string_value(tmp_path, sample):
    at = value_at(sample, "k.str") + 12  # type, length, then "hello"
    assert "k.str" in expect_rejected(tmp_path / "u.gguf", sample[:at] + b"\xc3\x28" + sample[at + 2:])


def test_missing_architecture(tmp_path, sample):
    at = value_at(sample, "general.architecture") - 1
    data = sample[:at] + b"X" + sample[at + 1:]
    assert "general.architecture" in expect_rejected(tmp_path / "a.gguf", data)


def last_data_byte(path) -> int:
    """Where the last tensor's data ends, according to gguf-py's own reader."""
    return max(t.data_offset + t.n_bytes for t in gguf.GGUFReader(path).tensors)


def test_every_truncation_of_the_header_and_a_sample_of_the_data(tmp_path, sample):
    original = tmp_path / "original.gguf"
    original.write_bytes(sample)
    end = last_data_byte(original)
    header_end = min(t.data_offset for t in gguf.GGUFReader(original).tensors)
    path = tmp_path / "cut.gguf"
    for length in [*range(header_end + 1), *range(header_end + 1, end, 7), end - 1]:
        path.write_bytes(sample[:length])
        with pytest.raises(ModelFileError, match="cut.gguf"):
            open_gguf(path)
    for length in range(end, len(sample) + 1):  # only padding is missing: the tensors are whole
        path.write_bytes(sample[:length])
        assert open_gguf(path).tensors["t.six"].data.tobytes() == sample[end - 6:end]


def test_truncated_real_model(tmp_path, tiny_model):
    path = tmp_path / "cut.gguf"
    end = len(tiny_model)
    for length in [0, 3, 8, 24, 100, 1000, 4000, end // 2, end - 100]:
        path.write_bytes(tiny_model[:length])
        with pytest.raises(ModelFileError):
            open_gguf(path)


def test_random_byte_flips_never_escape_as_other_errors(tmp_path, tiny_model):
    """Flip 1-4 random bytes, mostly in the header: either the file opens, or ModelFileError."""
    rng = np.random.default_rng(1234)
    original = tmp_path / "original.gguf"
    original.write_bytes(tiny_model)
    header_end = min(t.data_offset for t in gguf.GGUFReader(original).tensors)
    path = tmp_path / "flipped.gguf"
    outcomes = {"opened": 0, "rejected": 0}
    for _ in range(300):
        data = bytearray(tiny_model)
        for _ in range(rng.integers(1, 5)):
            limit = header_end if rng.random() < 0.9 else len(data)
            data[rng.integers(0, limit)] ^= int(rng.integers(1, 256))
        path.write_bytes(bytes(data))
        try:
            read_config(open_gguf(path))
            outcomes["opened"] += 1
        except ModelFileError:
            outcomes["rejected"] += 1
    assert outcomes["rejected"] > 50 and outcomes["opened"] > 10, outcomes


def test_missing_file(tmp_path):
    with pytest.raises(ModelFileError, match="does not exist"):
        open_gguf(tmp_path / "nothing.gguf")


def test_directory(tmp_path):
    with pytest.raises(ModelFileError, match="folder"):
        open_gguf(tmp_path)


def test_empty_file(tmp_path):
    (tmp_path / "empty.gguf").write_bytes(b"")
    with pytest.raises(ModelFileError, match="empty"):
        open_gguf(tmp_path / "empty.gguf")


def test_named_pipe_does_not_block(tmp_path):
    os.mkfifo(tmp_path / "pipe.gguf")
    with pytest.raises(ModelFileError, match="pipe.gguf"):
        open_gguf(tmp_path / "pipe.gguf")


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root reads files whatever their mode")
def test_permission_denied(tmp_path, sample):
    path = tmp_path / "locked.gguf"
    path.write_bytes(sample)
    path.chmod(0)
    with pytest.raises(ModelFileError, match="locked.gguf"):
        open_gguf(path)


def test_read_errors_are_wrapped(tmp_path, sample, monkeypatch):
    path = tmp_path / "denied.gguf"
    path.write_bytes(sample)

    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(mmap, "mmap", refuse)
    with pytest.raises(ModelFileError, match="denied.gguf.*Permission denied"):
        open_gguf(path)
