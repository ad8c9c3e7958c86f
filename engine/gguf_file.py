"""GGUF model files: validated, memory-mapped, and exposed without copying.

A GGUF file is a header (magic, version, counts, metadata key/values, tensor infos)
followed by aligned tensor data. `gguf.GGUFReader` parses it, but trusts every count
it reads: an absurd array length makes it loop in Python for hours, and a tensor that
points past the end of the file gives a short view or a NumPy error. So `GGUFFile`
first walks the header itself, checking each count, length, type and offset against
the size of the file, and only then lets GGUFReader parse it. Every failure, in either
step, raises `ModelFileError` (or `UnsupportedModelError`) naming the file.
"""

import math
import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import gguf
import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

from engine.errors import ModelFileError, UnsupportedModelError

SUPPORTED_VERSIONS = (2, 3)
MAX_DIMS = 4
# GGUFReader keeps a few NumPy views per metadata entry, array element and tensor, so
# these caps bound its time and memory whatever a file claims. Real models stay far
# below them: ~50 entries, a few thousand tensors, and vocabularies of up to ~262k
# tokens stored in three arrays (the array cap leaves room for five times that).
MAX_METADATA_ENTRIES = 1 << 16
MAX_TENSORS = 1 << 16
MAX_ARRAY_VALUES = 1 << 22

_CORRUPT_ADVICE = "The file is damaged, truncated or not a GGUF model; download it again."
_SCALAR_SIZES = {
    GGUFValueType.UINT8: 1, GGUFValueType.INT8: 1, GGUFValueType.BOOL: 1,
    GGUFValueType.UINT16: 2, GGUFValueType.INT16: 2,
    GGUFValueType.UINT32: 4, GGUFValueType.INT32: 4, GGUFValueType.FLOAT32: 4,
    GGUFValueType.UINT64: 8, GGUFValueType.INT64: 8, GGUFValueType.FLOAT64: 8,
}
_MIN_KV_BYTES = 8 + 4 + 1  # empty key, value type, one-byte value
_MIN_TENSOR_INFO_BYTES = 8 + 4 + 8 + 4 + 8  # empty name, n_dims, one dim, type, offset
_REQUIRED = object()


def _fail(path: Path, problem: str, advice: str = _CORRUPT_ADVICE, error: type = ModelFileError) -> NoReturn:
    raise error(f"Cannot open {path}: {problem}. {advice}")


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of a GGUF file: its name, ggml type, logical shape and raw bytes.

    `shape` is in NumPy (row-major) order, GGUF's `ne` reversed: a 2-D weight is
    (n_out, n_in). `data` is a read-only uint8 view of exactly the tensor's bytes in
    the memory map; nothing is copied.
    """

    name: str
    ggml_type: int
    shape: tuple[int, ...]
    data: np.ndarray

    @property
    def type_name(self) -> str:
        """The ggml type's name, e.g. "Q4_1"."""
        return GGMLQuantizationType(self.ggml_type).name

    @property
    def n_elements(self) -> int:
        """The number of weights the tensor holds."""
        return math.prod(self.shape)

    @property
    def n_bytes(self) -> int:
        """The size of the tensor's data in the file."""
        return self.data.nbytes


class _HeaderWalker:
    """Walks a GGUF header, checking every count, length, type and offset before use.

    Nothing is allocated from a size read in the file: each length is compared with the
    bytes that remain before it is used. The walk reads, it does not keep values.
    """

    def __init__(self, path: Path, buf: mmap.mmap):
        self.path = path
        self.buf = buf
        self.size = len(buf)
        self.pos = 0
        self.alignment = gguf.GGUF_DEFAULT_ALIGNMENT
        self.array_values = 0

    def fail(self, problem: str) -> NoReturn:
        _fail(self.path, problem)

    def take(self, n: int, what: str) -> int:
        """Advance over `n` bytes holding `what`; return where they start."""
        start = self.pos
        if n > self.size - start:
            self.fail(f"{what} at byte {start} needs {n} bytes but the file ends at byte {self.size}")
        self.pos = start + n
        return start

    def u32(self, what: str) -> int:
        return struct.unpack_from("<I", self.buf, self.take(4, what))[0]

    def u64(self, what: str) -> int:
        return struct.unpack_from("<Q", self.buf, self.take(8, what))[0]

    def text(self, what: str) -> str:
        """Read a GGUF string (u64 length, UTF-8 bytes) that names something."""
        length = self.u64(f"the length of {what}")
        start = self.take(length, what)
        try:
            return self.buf[start:start + length].decode("utf-8")
        except UnicodeDecodeError:
            self.fail(f"{what} at byte {start} is not valid UTF-8")

    def check_count(self, count: int, min_bytes: int, what: str, limit: int = MAX_ARRAY_VALUES) -> None:
        """Reject a count above `limit`, or one whose items could not fit in the rest of the file."""
        if count > limit:
            self.fail(f"it claims {count} {what}, more than the {limit} Sprig accepts")
        if count * min_bytes > self.size - self.pos:
            self.fail(f"it claims {count} {what}, more than the {self.size} bytes of the file can hold")

    def skip_strings(self, count: int, key: str) -> None:
        """Step over the `count` strings of the array `key`: one pass per token of a vocabulary."""
        problem = f"the strings of the array {key!r} run past the end of the file"
        pos, size, buf = self.pos, self.size, self.buf
        for _ in range(count):
            if pos + 8 > size:
                self.fail(problem)
            pos += 8 + struct.unpack_from("<Q", buf, pos)[0]
        if pos > size:
            self.fail(problem)
        self.pos = pos

    def skip_value(self, value_type: int, key: str) -> None:
        """Step over the value of `key`, of GGUF type `value_type`."""
        if value_type in _SCALAR_SIZES:
            self.take(_SCALAR_SIZES[value_type], f"the value of {key!r}")
        elif value_type == GGUFValueType.STRING:
            self.take(self.u64(f"the length of {key!r}"), f"the string value of {key!r}")
        elif value_type == GGUFValueType.ARRAY:
            item_type = self.u32(f"the item type of {key!r}")
            count = self.u64(f"the length of {key!r}")
            self.array_values += count
            if self.array_values > MAX_ARRAY_VALUES:
                self.fail(f"its metadata arrays hold more than {MAX_ARRAY_VALUES} values (at {key!r})")
            if item_type in _SCALAR_SIZES:
                self.take(count * _SCALAR_SIZES[item_type], f"the array {key!r}")
            elif item_type == GGUFValueType.STRING:
                self.check_count(count, 8, f"strings in the array {key!r}")
                self.skip_strings(count, key)
            elif item_type == GGUFValueType.ARRAY:
                self.fail(f"the metadata key {key!r} holds nested arrays, which GGUF models do not use")
            else:
                self.fail(f"the array {key!r} has unknown item type {item_type}")
        else:
            self.fail(f"the metadata key {key!r} has unknown value type {value_type}")

    def walk_metadata(self, count: int) -> None:
        """Step over `count` key/value entries, noting general.alignment on the way."""
        keys: set[str] = set()
        for _ in range(count):
            key = self.text("a metadata key")
            if key in keys:
                self.fail(f"the metadata key {key!r} appears twice")
            keys.add(key)
            value_type = self.u32(f"the value type of {key!r}")
            if key == gguf.Keys.General.ALIGNMENT:
                if value_type != GGUFValueType.UINT32:
                    self.fail(f"{key!r} must be a uint32, not value type {value_type}")
                self.alignment = self.u32(key)
                if self.alignment == 0 or self.alignment & (self.alignment - 1):
                    self.fail(f"{key!r} is {self.alignment}, which is not a power of two")
            else:
                self.skip_value(value_type, key)

    def tensor_info(self, names: set[str]) -> tuple[int, int, str]:
        """Read one tensor info; return its data offset, size in bytes and name."""
        name = self.text("a tensor name")
        if name in names:
            self.fail(f"the tensor {name!r} appears twice")
        names.add(name)
        n_dims = self.u32(f"the dimension count of {name!r}")
        if not 1 <= n_dims <= MAX_DIMS:
            self.fail(f"the tensor {name!r} has {n_dims} dimensions; GGUF allows 1 to {MAX_DIMS}")
        dims = [self.u64(f"a dimension of {name!r}") for _ in range(n_dims)]  # GGUF order: ne[0] is a row
        if not all(0 < d < 2**63 for d in dims):
            self.fail(f"the tensor {name!r} has an impossible shape {dims}")
        raw_type = self.u32(f"the type of {name!r}")
        try:
            block_size, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(raw_type)]
        except (ValueError, KeyError):
            _fail(self.path, f"the tensor {name!r} has ggml type {raw_type}, which Sprig does not know",
                  "The file may need a newer version of Sprig.", UnsupportedModelError)
        if dims[0] % block_size:
            self.fail(f"the rows of {name!r} ({dims[0]} values) are not whole blocks of {block_size}")
        offset = self.u64(f"the data offset of {name!r}")
        if offset % self.alignment:
            self.fail(f"the data of {name!r} starts at offset {offset}, not a multiple of {self.alignment}")
        return offset, math.prod(dims) // block_size * type_size, name

    def walk(self) -> None:
        """Check the whole layout of the file, or raise ModelFileError."""
        start = self.take(4, "the magic bytes")
        if self.buf[start:start + 4] != b"GGUF":
            self.fail("it does not start with the GGUF magic bytes")
        version = self.u32("the version")
        if version not in SUPPORTED_VERSIONS:
            swapped = int.from_bytes(version.to_bytes(4, "little"), "big")
            if swapped in SUPPORTED_VERSIONS:
                _fail(self.path, "it is a big-endian GGUF file",
                      "Sprig reads little-endian files only; use the little-endian build of the model.",
                      UnsupportedModelError)
            _fail(self.path, f"it is GGUF version {version}; Sprig reads versions 2 and 3",
                  "Convert the model again with a current llama.cpp.", UnsupportedModelError)
        n_tensors = self.u64("the tensor count")
        n_kv = self.u64("the metadata count")
        self.check_count(n_kv, _MIN_KV_BYTES, "metadata entries", MAX_METADATA_ENTRIES)
        self.walk_metadata(n_kv)
        self.check_count(n_tensors, _MIN_TENSOR_INFO_BYTES, "tensors", MAX_TENSORS)
        names: set[str] = set()
        spans = sorted(self.tensor_info(names) for _ in range(n_tensors))
        data_start = -(-self.pos // self.alignment) * self.alignment
        previous_end, previous_name = 0, ""
        for offset, n_bytes, name in spans:
            if data_start + offset + n_bytes > self.size:
                self.fail(f"the data of {name!r} ({n_bytes} bytes at offset {offset}) runs past the end")
            if offset < previous_end:
                self.fail(f"the data of {name!r} overlaps the data of {previous_name!r}")
            previous_end, previous_name = offset + n_bytes, name


class _MappedReader(gguf.GGUFReader):
    """GGUFReader over a plain ndarray view of its memory map.

    GGUFReader slices its `np.memmap` once per metadata value, and np.memmap's subclass
    hooks on each slice make up most of its parse time on a large vocabulary (about 3x).
    The plain view shares the same mapping, so nothing is copied and it stays read-only.
    """

    @property
    def data(self) -> np.ndarray:
        return self._mapped

    @data.setter
    def data(self, value: np.memmap) -> None:
        self._mapped = value.view(np.ndarray)


def _validate_layout(path: Path) -> None:
    """Walk the header of `path` through a read-only map, or raise ModelFileError."""
    try:
        if not path.exists():
            _fail(path, "the file does not exist", "Check the path, or choose another model file.")
        if not path.is_file():  # a folder, or a pipe or device that could block or never end
            kind = "a folder" if path.is_dir() else "not a regular file"
            _fail(path, f"it is {kind}", "Choose a .gguf model file.")
        with open(path, "rb") as fh:
            if path.stat().st_size == 0:
                _fail(path, "the file is empty")
            with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
                _HeaderWalker(path, buf).walk()
    except (OSError, ValueError) as exc:  # ValueError: mmap of a file emptied meanwhile
        reason = getattr(exc, "strerror", None) or exc
        _fail(path, f"it cannot be read ({reason})", "Check that you may read the file.")


def _plain_metadata(path: Path, reader: gguf.GGUFReader) -> dict[str, Any]:
    """Metadata as plain Python values, without GGUFReader's own "GGUF.*" header fields."""
    metadata = {}
    for key, field in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        try:
            metadata[key] = field.contents()
        except UnicodeDecodeError:
            _fail(path, f"the metadata key {key!r} holds text that is not valid UTF-8")
    return metadata


class GGUFFile:
    """A validated, memory-mapped GGUF file: its metadata as plain values and its tensors as views.

    The GGUFReader is dropped once its values are copied out: it holds one NumPy view per
    metadata value (about 200 MB for a 262k-token vocabulary). The tensor views keep the
    memory map alive by themselves.
    """

    def __init__(self, path: str | Path):
        """Validate `path`, then parse it with gguf.GGUFReader. Raises ModelFileError."""
        self.path = Path(path)
        _validate_layout(self.path)
        try:
            reader = _MappedReader(self.path)
        except Exception as exc:  # the layout was checked, so this is a value GGUFReader rejects
            _fail(self.path, f"gguf could not read it ({type(exc).__name__}: {exc})")
        self.version = int(reader.fields["GGUF.version"].contents())
        self.metadata: dict[str, Any] = _plain_metadata(self.path, reader)
        self.tensors: dict[str, TensorInfo] = {
            t.name: TensorInfo(
                name=t.name,
                ggml_type=int(t.tensor_type),
                shape=tuple(int(d) for d in reversed(t.shape.tolist())),
                data=reader.data[t.data_offset:t.data_offset + t.n_bytes],
            )
            for t in reader.tensors
        }
        architecture = self.metadata.get(gguf.Keys.General.ARCHITECTURE)
        if not isinstance(architecture, str) or not architecture:
            _fail(self.path, "the metadata key 'general.architecture' is missing or not a name")
        self.architecture: str = architecture

    def get(self, key: str, default: Any = None) -> Any:
        """The metadata value under `key`, or `default`."""
        return self.metadata.get(key, default)

    def arch_key(self, suffix: str, default: Any = _REQUIRED) -> Any:
        """The value of `{architecture}.{suffix}`; without a default, a missing key raises ModelFileError."""
        key = f"{self.architecture}.{suffix}"
        if key in self.metadata:
            return self.metadata[key]
        if default is _REQUIRED:
            _fail(self.path, f"the metadata key {key!r} is missing")
        return default

    def close(self) -> None:
        """Drop the tensor views; the map is freed once no view is left elsewhere."""
        self.tensors = {}

    def __enter__(self) -> "GGUFFile":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"GGUFFile({str(self.path)!r}, {self.architecture}, {len(self.tensors)} tensors)"


def open_gguf(path: str | Path) -> GGUFFile:
    """Open and validate the GGUF file at `path`. Raises ModelFileError."""
    return GGUFFile(path)
