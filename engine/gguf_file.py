"""GGUF model files: validated, memory-mapped, and exposed without copying.

A GGUF file is a header (magic, version, counts, metadata key/values, tensor infos)
followed by aligned tensor data. Sprig reads the header itself, in one pass that checks
each count, length, type and offset against the size of the file before using it, and
decodes the values on the way: every failure raises `ModelFileError` (or
`UnsupportedModelError`) naming the file.

Why not `gguf.GGUFReader`: it trusts the counts it reads (an absurd array length makes
it loop in Python for hours), and it builds several NumPy views per array element, so a
262k-token vocabulary took about 3.5 s to open (Gemma 3) before a single weight was touched;
the upstream fix (llama.cpp PR 13378) is still open. Decoding numeric arrays with one
`np.frombuffer` each and strings with one `struct` call each takes 0.12 s. The `gguf`
package still supplies the format's constants, and its reader is the independent
reference the tests compare this one with, value by value.
"""

import math
import mmap
import re
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
# Every metadata entry, array element and tensor becomes a Python object, so these caps
# bound the time and memory a header takes whatever a file claims. Real models stay far
# below them: ~50 entries, a few thousand tensors, and vocabularies of up to ~262k
# tokens stored in three arrays (the array cap leaves room for five times that).
MAX_METADATA_ENTRIES = 1 << 16
MAX_TENSORS = 1 << 16
MAX_ARRAY_VALUES = 1 << 22

_CORRUPT_ADVICE = "The file is damaged, truncated or not a GGUF model; download it again."
_SCALAR_DTYPES: dict[int, np.dtype] = {  # little-endian, as GGUF stores them
    GGUFValueType.UINT8: np.dtype("<u1"),
    GGUFValueType.INT8: np.dtype("<i1"),
    GGUFValueType.BOOL: np.dtype("?"),
    GGUFValueType.UINT16: np.dtype("<u2"),
    GGUFValueType.INT16: np.dtype("<i2"),
    GGUFValueType.UINT32: np.dtype("<u4"),
    GGUFValueType.INT32: np.dtype("<i4"),
    GGUFValueType.FLOAT32: np.dtype("<f4"),
    GGUFValueType.UINT64: np.dtype("<u8"),
    GGUFValueType.INT64: np.dtype("<i8"),
    GGUFValueType.FLOAT64: np.dtype("<f8"),
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


@dataclass(frozen=True)
class _Header:
    """What a header walk found: the version, the metadata, and where each tensor lies."""

    version: int
    metadata: dict[str, Any]
    tensors: list[tuple[str, int, tuple[int, ...], int, int]]  # name, ggml type, dims (GGUF order), start, bytes


class _HeaderReader:
    """Reads a GGUF header, checking every count, length, type and offset before use.

    Nothing is allocated from a size read in the file: each length is compared with the
    bytes that remain before it is used.
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

    def text(self, what: str, key: str | None = None) -> str:
        """Read a GGUF string (u64 length, UTF-8 bytes): a name, or the value of `key`."""
        length = self.u64(f"the length of {what}")
        start = self.take(length, what)
        try:
            return self.buf[start : start + length].decode("utf-8")
        except UnicodeDecodeError:
            self.fail(
                f"the metadata key {key!r} holds text that is not valid UTF-8"
                if key
                else f"{what} at byte {start} is not valid UTF-8"
            )

    def check_count(self, count: int, min_bytes: int, what: str, limit: int = MAX_ARRAY_VALUES) -> None:
        """Reject a count above `limit`, or one whose items could not fit in the rest of the file."""
        if count > limit:
            self.fail(f"it claims {count} {what}, more than the {limit} Sprig accepts")
        if count * min_bytes > self.size - self.pos:
            self.fail(f"it claims {count} {what}, more than the {self.size} bytes of the file can hold")

    def strings(self, count: int, key: str) -> list[str]:
        """The `count` strings of the array `key`: one pass per token of a vocabulary."""
        problem = f"the strings of the array {key!r} run past the end of the file"
        pos, size, buf = self.pos, self.size, self.buf
        values = []
        try:
            for _ in range(count):
                if pos + 8 > size:
                    self.fail(problem)
                length = struct.unpack_from("<Q", buf, pos)[0]
                pos += 8
                if length > size - pos:
                    self.fail(problem)
                values.append(buf[pos : pos + length].decode("utf-8"))
                pos += length
        except UnicodeDecodeError:
            self.fail(f"the metadata key {key!r} holds text that is not valid UTF-8")
        self.pos = pos
        return values

    def value(self, value_type: int, key: str) -> Any:
        """The value of `key`, of GGUF type `value_type`, as plain Python values."""
        if value_type in _SCALAR_DTYPES:
            dtype = _SCALAR_DTYPES[value_type]
            return np.frombuffer(self.buf, dtype, 1, self.take(dtype.itemsize, f"the value of {key!r}")).item()
        if value_type == GGUFValueType.STRING:
            return self.text(f"the string value of {key!r}", key)
        if value_type != GGUFValueType.ARRAY:
            self.fail(f"the metadata key {key!r} has unknown value type {value_type}")
        item_type = self.u32(f"the item type of {key!r}")
        count = self.u64(f"the length of {key!r}")
        self.array_values += count
        if self.array_values > MAX_ARRAY_VALUES:
            self.fail(f"its metadata arrays hold more than {MAX_ARRAY_VALUES} values (at {key!r})")
        if item_type in _SCALAR_DTYPES:
            dtype = _SCALAR_DTYPES[item_type]
            start = self.take(count * dtype.itemsize, f"the array {key!r}")
            return np.frombuffer(self.buf, dtype, count, start).tolist()
        if item_type == GGUFValueType.STRING:
            self.check_count(count, 8, f"strings in the array {key!r}")
            return self.strings(count, key)
        if item_type == GGUFValueType.ARRAY:
            self.fail(f"the metadata key {key!r} holds nested arrays, which GGUF models do not use")
        self.fail(f"the array {key!r} has unknown item type {item_type}")

    def metadata(self, count: int) -> dict[str, Any]:
        """Read `count` key/value entries, checking general.alignment on the way."""
        entries: dict[str, Any] = {}
        for _ in range(count):
            key = self.text("a metadata key")
            if key in entries:
                self.fail(f"the metadata key {key!r} appears twice")
            value_type = self.u32(f"the value type of {key!r}")
            if key == gguf.Keys.General.ALIGNMENT:
                if value_type != GGUFValueType.UINT32:
                    self.fail(f"{key!r} must be a uint32, not value type {value_type}")
                self.alignment = self.u32(key)
                if self.alignment == 0 or self.alignment & (self.alignment - 1):
                    self.fail(f"{key!r} is {self.alignment}, which is not a power of two")
                entries[key] = self.alignment
            else:
                entries[key] = self.value(value_type, key)
        return entries

    def tensor_info(self, names: set[str]) -> tuple[int, int, str, int, tuple[int, ...]]:
        """Read one tensor info; return its data offset, size in bytes, name, type and dims."""
        name = self.text("a tensor name")
        if name in names:
            self.fail(f"the tensor {name!r} appears twice")
        names.add(name)
        n_dims = self.u32(f"the dimension count of {name!r}")
        if not 1 <= n_dims <= MAX_DIMS:
            self.fail(f"the tensor {name!r} has {n_dims} dimensions; GGUF allows 1 to {MAX_DIMS}")
        dims = tuple(self.u64(f"a dimension of {name!r}") for _ in range(n_dims))  # GGUF order: ne[0] is a row
        if not all(0 < d < 2**63 for d in dims):
            self.fail(f"the tensor {name!r} has an impossible shape {list(dims)}")
        raw_type = self.u32(f"the type of {name!r}")
        try:
            block_size, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(raw_type)]
        except (ValueError, KeyError):
            _fail(
                self.path,
                f"the tensor {name!r} has ggml type {raw_type}, which Sprig does not know",
                "The file may need a newer version of Sprig.",
                UnsupportedModelError,
            )
        if dims[0] % block_size:
            self.fail(f"the rows of {name!r} ({dims[0]} values) are not whole blocks of {block_size}")
        offset = self.u64(f"the data offset of {name!r}")
        if offset % self.alignment:
            self.fail(f"the data of {name!r} starts at offset {offset}, not a multiple of {self.alignment}")
        return offset, math.prod(dims) // block_size * type_size, name, raw_type, dims

    def read(self) -> _Header:
        """Read and check the whole header, or raise ModelFileError."""
        start = self.take(4, "the magic bytes")
        if self.buf[start : start + 4] != b"GGUF":
            self.fail("it does not start with the GGUF magic bytes")
        version = self.u32("the version")
        if version not in SUPPORTED_VERSIONS:
            swapped = int.from_bytes(version.to_bytes(4, "little"), "big")
            if swapped in SUPPORTED_VERSIONS:
                _fail(
                    self.path,
                    "it is a big-endian GGUF file",
                    "Sprig reads little-endian files only; use the little-endian build of the model.",
                    UnsupportedModelError,
                )
            _fail(
                self.path,
                f"it is GGUF version {version}; Sprig reads versions 2 and 3",
                "Convert the model again with a current llama.cpp.",
                UnsupportedModelError,
            )
        n_tensors = self.u64("the tensor count")
        n_kv = self.u64("the metadata count")
        self.check_count(n_kv, _MIN_KV_BYTES, "metadata entries", MAX_METADATA_ENTRIES)
        metadata = self.metadata(n_kv)
        self.check_count(n_tensors, _MIN_TENSOR_INFO_BYTES, "tensors", MAX_TENSORS)
        names: set[str] = set()
        infos = [self.tensor_info(names) for _ in range(n_tensors)]
        data_start = -(-self.pos // self.alignment) * self.alignment
        previous_end, previous_name = 0, ""
        for offset, n_bytes, name, _type, _dims in sorted(infos):
            if data_start + offset + n_bytes > self.size:
                self.fail(f"the data of {name!r} ({n_bytes} bytes at offset {offset}) runs past the end")
            if offset < previous_end:
                self.fail(f"the data of {name!r} overlaps the data of {previous_name!r}")
            previous_end, previous_name = offset + n_bytes, name
        tensors = [
            (name, raw_type, dims, data_start + offset, n_bytes) for offset, n_bytes, name, raw_type, dims in infos
        ]
        return _Header(version, metadata, tensors)


def _read_header(path: Path) -> tuple[_Header, np.ndarray]:
    """The checked header of `path` and a read-only uint8 view of the whole file's map."""
    try:
        if not path.exists():
            _fail(path, "the file does not exist", "Check the path, or choose another model file.")
        if not path.is_file():  # a folder, or a pipe or device that could block or never end
            kind = "a folder" if path.is_dir() else "not a regular file"
            _fail(path, f"it is {kind}", "Choose a .gguf model file.")
        with open(path, "rb") as fh:
            if path.stat().st_size == 0:
                _fail(path, "the file is empty")
            buf = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        try:
            header = _HeaderReader(path, buf).read()
        except BaseException:
            buf.close()  # a rejected file is not left mapped (or, on Windows, locked)
            raise
        return header, np.frombuffer(buf, dtype=np.uint8)  # the tensor views keep the map alive
    except (OSError, ValueError) as exc:  # ValueError: mmap of a file emptied meanwhile
        reason = getattr(exc, "strerror", None) or exc
        _fail(path, f"it cannot be read ({reason})", "Check that you may read the file.")


SPLIT_NAME = re.compile(r"^(?P<stem>.*)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$", re.IGNORECASE)


def _views(header: _Header, data: np.ndarray) -> dict[str, TensorInfo]:
    """The tensors of one file's header, as views of its map."""
    return {
        name: TensorInfo(
            name=name, ggml_type=ggml_type, shape=tuple(reversed(dims)), data=data[start : start + n_bytes]
        )
        for name, ggml_type, dims, start, n_bytes in header.tensors
    }


def split_parts(path: Path, metadata: dict[str, Any]) -> list[Path]:
    """The other files of a model split into parts (llama.cpp's gguf-split: `split.count` in
    the first part's metadata, parts named `...-0000k-of-0000N.gguf`), in order; none for a
    whole file. ModelFileError where the first part's name or metadata does not add up."""
    count = metadata.get("split.count", 1)
    if count == 1 or count is None:
        return []
    named = SPLIT_NAME.match(path.name)
    if not isinstance(count, int) or count < 1 or named is None or int(named["count"]) != count:
        _fail(path, f"it says it is one of {count} parts, but its name is not `...-00001-of-{count:05d}.gguf`")
    if int(named["no"]) != 1 or metadata.get("split.no", 0) != 0:
        _fail(path, "it is not the first part of its model", "Open the part whose name ends in -00001-of-….gguf.")
    return [path.with_name(f"{named['stem']}-{k:05d}-of-{count:05d}{path.suffix}") for k in range(2, count + 1)]


class GGUFFile:
    """A validated, memory-mapped GGUF file: its metadata as plain values and its tensors as
    views. A model split into parts (`split_parts`) opens from its first part: the metadata
    is the first part's, the tensors those of every part."""

    def __init__(self, path: str | Path):
        """Read and validate the header of `path`, and of its other parts if it is split.
        Raises ModelFileError."""
        self.path = Path(path)
        header, data = _read_header(self.path)
        self.version = header.version
        self.metadata: dict[str, Any] = header.metadata
        self.tensors: dict[str, TensorInfo] = _views(header, data)
        self.parts = [self.path]
        for part in split_parts(self.path, self.metadata):
            if not part.is_file():
                _fail(self.path, f"its part {part.name} is missing", "Download every part into the same folder.")
            part_header, part_data = _read_header(part)
            if part_header.metadata.get("split.no") != len(self.parts):
                _fail(part, f"it should be part {len(self.parts) + 1} of its model, but says otherwise")
            views = _views(part_header, part_data)
            if clash := next((name for name in views if name in self.tensors), None):
                _fail(part, f"the tensor {clash!r} is in two parts of the model")
            self.tensors.update(views)
            self.parts.append(part)
        if self.metadata.get("split.tensors.count", len(self.tensors)) != len(self.tensors):
            _fail(
                self.path,
                f"its parts hold {len(self.tensors)} tensors, but it says {self.metadata['split.tensors.count']}",
            )
        architecture = self.metadata.get(gguf.Keys.General.ARCHITECTURE)
        if not isinstance(architecture, str) or not architecture:
            _fail(self.path, "the metadata key 'general.architecture' is missing or not a name")
        self.architecture: str = architecture

    @property
    def size(self) -> int:
        """Bytes of the file, or of all its parts."""
        return sum(part.stat().st_size for part in self.parts)

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
