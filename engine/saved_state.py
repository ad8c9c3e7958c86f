"""Saved conversation states: a KV cache written to a file, and read back instead of the text.

A conversation that is left keeps its KV cache (every layer's state: attention keys and
values, windowed rings, recurrent arrays) in one file of a folder, with what it is only
valid for: the model file's fingerprint, the backend, the layout of the state's arrays
(their dtypes, so the KV type, and shapes) and the token ids it holds. Reopening the
conversation restores the file when those match the prompt's first tokens (the rest is
read as usual), and reads the whole text again otherwise.

The arrays are whatever the backend holds the state in (`Backend.state_arrays`), cut into
pieces of 4 MiB, each packed and hashed on a thread of its own (NumPy and hashlib let go of
the GIL). A piece is stored as a bitmap of its 4 KiB blocks, a bit set for each block that
holds a byte other than zero, followed by those blocks as they are: the unused, zeroed
positions of the context take one bit per block, and the keys and values themselves go to
disk at its speed. (The first format compressed every piece with zlib, which shrinks float
data by about 6% at a few tens of MB/s a core: a save of 4,096 tokens took 1.6 s. NumPy's
`savez_compressed` is zlib too, and `np.load` allocates whatever shape a file declares
before reading it.)

A file is

    MAGIC | the pieces of every array | header (JSON) | header length (u64) | header SHA-256 | END

with the header at the end so that arrays stream to disk as they are packed. Nothing
in a file is trusted: a file is refused, with a note in the log, when it is truncated,
its header's hash or a piece's hash fails, its fingerprint, backend or layout differs
from the live cache (declared shapes are compared, never allocated: pieces are unpacked
into the cache's own memory, at most their exact size, once every hash holds), or its
tokens are not the prompt's; so is a file of the first format (every piece compressed),
which the next save replaces. No pickle is ever read. The folder keeps under a size cap,
dropping the least recently used files first.
"""

import hashlib
import json
import logging
import os
import struct
import tempfile
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from engine.kv_cache import KVCache

log = logging.getLogger(__name__)

MAGIC = b"SPRIGKV\x02"
MAGIC_NAME = MAGIC[:-1]  # what every format's magic begins with; the last byte is the format
END = b"SPRIGEND"
SUFFIX = ".sprigkv"
FORMAT = 2  # 1: every piece zlib-compressed; 2: each piece its nonzero blocks, after their bitmap
BLOCK = 4096  # the bytes of a block: the unit in which zeros are left out
CHUNK = 4 << 20  # the bytes of one piece (a whole number of blocks): packed and unpacked one per core at a time
MAX_CHUNK = 1 << 30
WORKERS = os.cpu_count() or 1
MAX_HEADER = 64 << 20  # a header holds the token ids: ~10 bytes each, far below this at any context
_TRAILER = struct.Struct("<Q32s8s")  # header length, header SHA-256, END
FINGERPRINT_HEAD = 16 << 20  # the GGUF header (metadata, vocabulary, tensor infos) lies in here
FINGERPRINT_SAMPLES = 16  # and this many 1 MiB pieces of the weights, evenly spread
DEFAULT_CAP_BYTES = 2 << 30


class StateFileError(Exception):
    """A saved state that cannot be used; the message says why, for the log."""


@cache
def _fingerprint(path: str, size: int, mtime_ns: int) -> str:
    digest = hashlib.sha256(str(size).encode())
    with open(path, "rb") as f:
        digest.update(f.read(FINGERPRINT_HEAD))
        for i in range(FINGERPRINT_SAMPLES):
            f.seek(size * i // FINGERPRINT_SAMPLES)
            digest.update(f.read(1 << 20))
    return digest.hexdigest()


def model_fingerprint(path: Path) -> str:
    """A SHA-256 that tells model files apart: over the size, the first 16 MiB (the whole
    GGUF header in practice) and 16 pieces of the weights. Cached per path, size and
    modification time, so it is read once per file."""
    stat = os.stat(path)
    return _fingerprint(str(Path(path).resolve()), stat.st_size, stat.st_mtime_ns)


def _layout(arrays: list[np.ndarray]) -> list[dict]:
    return [{"dtype": a.dtype.str, "shape": list(a.shape)} for a in arrays]


@dataclass(frozen=True)
class Identity:
    """What a saved state is valid for: the model's fingerprint (its file's, and its LoRA
    adapters' with their scales) and the backend."""

    fingerprint: str
    backend: str


def identity_of(path: Path, model: Any) -> Identity:
    """The identity of states computed by `model`, loaded from the file at `path`, as it runs now."""
    adapters = getattr(model, "adapters", None)
    parts = [model_fingerprint(path)]
    for active in adapters.active if adapters is not None else ():
        parts.append(f"{model_fingerprint(active.adapter.path)}*{active.scale!r}")
    fingerprint = parts[0] if len(parts) == 1 else hashlib.sha256("+".join(parts).encode()).hexdigest()
    return Identity(fingerprint, model.backend.name)


def _pieces(array: np.ndarray) -> list[memoryview]:
    """The array's bytes in CHUNK-sized views (its own memory where it is contiguous)."""
    raw = np.ascontiguousarray(array).reshape(-1).view(np.uint8).data  # (nbytes,)
    return [raw[lo : lo + CHUNK] for lo in range(0, len(raw), CHUNK)]


def _blocks(data: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`data`'s whole BLOCK-sized blocks, (n, BLOCK), and what is left after them, (< BLOCK,)."""
    whole = len(data) // BLOCK * BLOCK
    return data[:whole].reshape(-1, BLOCK), data[whole:]


def _pack(piece: memoryview) -> tuple[bytes, str]:
    """What is stored for `piece`: the bitmap of its blocks (BLOCK bytes, the last perhaps
    short) that hold a nonzero byte, in NumPy's `packbits` order, then those blocks; and the
    SHA-256 of it."""
    blocks, tail = _blocks(np.frombuffer(piece, np.uint8))
    kept = np.asarray(blocks.view(np.uint64).any(axis=1))  # (n,)
    if len(tail):
        kept = np.append(kept, tail.any())
    parts = [np.packbits(kept).tobytes(), blocks[kept[: len(blocks)]].tobytes()]
    stored = b"".join([*parts, tail.tobytes()] if len(tail) and kept[-1] else parts)
    return stored, hashlib.sha256(stored).hexdigest()


def _unpack(stored: bytes, out: memoryview) -> None:
    """Write what `_pack` stored for a piece into `out`, the piece's place in the cache; the
    stored bytes must be exactly the bitmap and the blocks it names, else StateFileError."""
    blocks, tail = _blocks(np.frombuffer(out, np.uint8))  # views of the cache's memory
    n_blocks = len(blocks) + (len(tail) > 0)
    n_bitmap = -(-n_blocks // 8)
    kept = np.unpackbits(np.frombuffer(stored[:n_bitmap], np.uint8), count=n_blocks).astype(bool)  # (n_blocks,)
    whole = int(kept[: len(blocks)].sum())
    with_tail = len(tail) > 0 and bool(kept[-1])
    expected = n_bitmap + whole * BLOCK + (len(tail) if with_tail else 0)
    if len(stored) != expected:
        raise StateFileError(f"an array holds {'more' if len(stored) > expected else 'less'} data than its shape")
    data = np.frombuffer(stored, np.uint8, offset=n_bitmap)  # (the kept blocks' bytes,)
    blocks[kept[: len(blocks)]] = data[: whole * BLOCK].reshape(whole, BLOCK)
    blocks[~kept[: len(blocks)]] = 0
    tail[:] = data[whole * BLOCK :] if with_tail else 0


def _in_order(pool: ThreadPoolExecutor, fn: Callable[[Any], Any], items: list) -> Iterator[Any]:
    """`fn` of each item on `pool`, in order, with at most two per worker under way."""
    pending: deque[Future] = deque()
    for item in items:
        pending.append(pool.submit(fn, item))
        if len(pending) >= 2 * WORKERS:
            yield pending.popleft().result()
    while pending:
        yield pending.popleft().result()


def write_state(path: Path, cache_: KVCache, identity: Identity) -> int:
    """Write `cache_`'s state and tokens to `path` (atomically: a temporary file, then a
    rename); return the file's size. The arrays go in pieces of CHUNK bytes, packed one per
    core at a time."""
    arrays = cache_.backend.state_arrays(cache_.storage)
    pieces = [(i, piece) for i, array in enumerate(arrays) for piece in _pieces(array)]
    chunks: list[list] = [[] for _ in arrays]
    handle, temporary = tempfile.mkstemp(dir=path.parent, suffix=".part")
    try:
        with os.fdopen(handle, "wb") as f, ThreadPoolExecutor(WORKERS) as pool:
            f.write(MAGIC)
            packed = _in_order(pool, _pack, [piece for _, piece in pieces])
            for (i, _), (block, digest) in zip(pieces, packed, strict=True):
                chunks[i].append([f.tell(), len(block), digest])
                f.write(block)
            header = {
                "format": FORMAT,
                "fingerprint": identity.fingerprint,
                "backend": identity.backend,
                "kv_dtypes": sorted({a.dtype.name for a in arrays}),
                "n_ctx": cache_.n_ctx,
                "tokens": list(cache_.tokens),
                "chunk_bytes": CHUNK,
                "arrays": [{**layout, "chunks": c} for layout, c in zip(_layout(arrays), chunks, strict=True)],
            }
            data = json.dumps(header, separators=(",", ":")).encode()
            f.write(data)
            f.write(_TRAILER.pack(len(data), hashlib.sha256(data).digest(), END))
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return path.stat().st_size


def read_header(path: Path) -> dict:
    """The checked header of the state file at `path`; StateFileError saying what is wrong."""
    try:
        with open(path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            if size < len(MAGIC) + _TRAILER.size:
                raise StateFileError("it is too short to be a saved state")
            f.seek(0)
            magic = f.read(len(MAGIC))
            if magic != MAGIC:
                older = magic.startswith(MAGIC_NAME) and magic[-1] < MAGIC[-1]
                why = "it was saved by an earlier version of Sprig" if older else "it is not a saved state"
                raise StateFileError(why)
            f.seek(size - _TRAILER.size)
            length, digest, end = _TRAILER.unpack(f.read(_TRAILER.size))
            if end != END:
                raise StateFileError("it is truncated")
            start = size - _TRAILER.size - length
            if length > MAX_HEADER or start < len(MAGIC):
                raise StateFileError(f"its header claims {length} bytes")
            f.seek(start)
            data = f.read(length)
    except OSError as exc:
        raise StateFileError(f"it cannot be read ({exc.strerror or exc})") from exc
    if hashlib.sha256(data).digest() != digest:
        raise StateFileError("its header is corrupt")
    try:
        header = json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise StateFileError("its header is not JSON") from exc
    _check_header(header, start)
    return header


def _check_header(header: Any, data_end: int) -> None:
    """Types and bounds of every field a restore uses (a hash only proves the writer wrote it)."""
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise StateFileError("its header is not of this version")
    tokens, arrays, chunk_bytes = header.get("tokens"), header.get("arrays"), header.get("chunk_bytes")
    if not isinstance(tokens, list) or not all(type(t) is int and t >= 0 for t in tokens):
        raise StateFileError("its token ids are malformed")
    if type(chunk_bytes) is not int or not 0 < chunk_bytes <= MAX_CHUNK:
        raise StateFileError("its piece size is malformed")
    if not isinstance(arrays, list) or not all(
        isinstance(e, dict) and isinstance(e.get("chunks"), list) for e in arrays
    ):
        raise StateFileError("its array list is malformed")
    end = len(MAGIC)
    for chunk in (chunk for entry in arrays for chunk in entry["chunks"]):
        if not isinstance(chunk, list) or len(chunk) != 3 or not isinstance(chunk[2], str):
            raise StateFileError("an array's piece is malformed")
        offset, length = chunk[0], chunk[1]
        if type(offset) is not int or type(length) is not int or not end <= offset <= data_end - length:
            raise StateFileError("an array lies outside the file")
        end = offset + length


class _Pieces:
    """Reads the stored pieces of an open state file, from any thread (`os.pread`)."""

    def __init__(self, fd: int):
        self.fd = fd

    def read(self, chunk: list) -> bytes:
        """The stored bytes of one piece; StateFileError if the file ends first."""
        data = os.pread(self.fd, chunk[1], chunk[0])
        if len(data) != chunk[1]:
            raise StateFileError("it is truncated")
        return data

    def verify(self, chunk: list) -> None:
        """StateFileError unless the piece's SHA-256 is the header's."""
        if hashlib.sha256(self.read(chunk)).hexdigest() != chunk[2]:
            raise StateFileError("an array is corrupt")

    def unpack(self, job: tuple[list, memoryview]) -> None:
        """Write one piece straight into `out`: exactly its size, or StateFileError."""
        chunk, out = job
        _unpack(self.read(chunk), out)


def matching_tokens(saved: Sequence[int], prompt: Sequence[int]) -> int:
    """How many leading tokens `saved` and `prompt` share."""
    n = 0
    for a, b in zip(saved, prompt, strict=False):
        if a != b:
            break
        n += 1
    return n


def _unpack_jobs(header: dict, arrays: list[np.ndarray], backend: str) -> list[tuple[list, memoryview]]:
    """Each piece of the file with the part of the live arrays it fills; StateFileError
    unless the file's arrays have the live ones' dtypes and shapes, piece for piece."""
    if [{"dtype": e.get("dtype"), "shape": e.get("shape")} for e in header["arrays"]] != _layout(arrays):
        raise StateFileError("its arrays are not this cache's (another context length or KV type)")
    if not all(a.flags.c_contiguous for a in arrays):
        raise StateFileError(f"the {backend} backend's state cannot be written in place")
    step = header["chunk_bytes"]
    jobs = []
    for entry, array in zip(header["arrays"], arrays, strict=True):
        out = array.reshape(-1).view(np.uint8).data  # (nbytes,), a view: written in place
        if len(entry["chunks"]) != -(-len(out) // step):
            raise StateFileError("an array's pieces do not cover its shape")
        jobs += [(chunk, out[i * step : (i + 1) * step]) for i, chunk in enumerate(entry["chunks"])]
    return jobs


def restore_state(path: Path, cache_: KVCache, prompt: Sequence[int], identity: Identity) -> int:
    """Load the state file at `path` into `cache_` when it serves `prompt` better than what
    the cache holds; return how many of the prompt's tokens the cache then holds, 0 if it
    was not used. StateFileError, with the cache as it was or emptied, when the file is not
    this model's, this backend's or this layout's, does not hold the prompt's tokens, or
    is damaged."""
    header = read_header(path)
    if header.get("fingerprint") != identity.fingerprint:
        raise StateFileError("it was saved with another model file")
    if header.get("backend") != identity.backend:
        raise StateFileError(f"it was saved on the {header.get('backend')} backend")
    tokens = header["tokens"]
    if len(tokens) > cache_.n_ctx:
        raise StateFileError(f"it holds {len(tokens)} tokens, more than the context of {cache_.n_ctx}")
    last = max(len(prompt) - 1, 0)  # generation reads the last prompt token again for its logits
    kept = min(matching_tokens(tokens, prompt), last)
    if kept == 0 or len(tokens) - kept > cache_.rewind_limit:
        raise StateFileError("its tokens are not this conversation's")
    if kept <= min(cache_.common_prefix(prompt), last):
        return 0  # the cache already holds as much
    arrays = cache_.backend.state_arrays(cache_.storage)
    jobs = _unpack_jobs(header, arrays, identity.backend)
    fd = os.open(path, os.O_RDONLY)
    try:
        pieces = _Pieces(fd)
        with ThreadPoolExecutor(WORKERS) as pool:
            # every hash first, so that nothing of a damaged file is loaded
            list(pool.map(pieces.verify, [chunk for chunk, _ in jobs]))
            try:
                list(pool.map(pieces.unpack, jobs))
            except BaseException:
                cache_.reset()
                raise
    finally:
        os.close(fd)
    cache_.backend.load_state_arrays(cache_.storage, arrays)
    cache_.adopt(tokens)
    cache_.truncate(kept)
    return kept


@dataclass(frozen=True)
class Restored:
    """What a restore came to: how many of the prompt's tokens the cache holds from the file
    (0: none), and why the file was refused, when it was (for the log and the user)."""

    tokens: int = 0
    refused: str | None = None


class SavedStates:
    """A folder of saved conversation states, one file per key, under a size cap."""

    def __init__(self, folder: Path, cap_bytes: int = DEFAULT_CAP_BYTES):
        self.folder = Path(folder)
        self.cap_bytes = cap_bytes

    def path(self, key: str) -> Path:
        """The file of `key`."""
        return self.folder / f"{key}{SUFFIX}"

    def save(self, key: str, cache_: KVCache, identity: Identity) -> bool:
        """Write `cache_` as `key`'s state (nothing when it holds no tokens), then keep the
        folder under the cap. False, with a note in the log, when it could not be written."""
        if not cache_.n_used:
            return False
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            size = write_state(self.path(key), cache_, identity)
        except (OSError, MemoryError) as exc:
            log.warning("the conversation's state was not saved: %s", exc or type(exc).__name__)
            return False
        log.info("saved %d tokens of state for %s (%.1f MB)", cache_.n_used, key, size / 1e6)
        self.evict()
        return self.path(key).exists()

    def restore(self, key: str, cache_: KVCache, prompt: Sequence[int], identity: Identity) -> Restored:
        """Restore `key`'s saved state into `cache_` for `prompt` where it fits (see
        `restore_state`): the prompt tokens it holds then (0 if nothing was restored). A file
        that cannot be used is noted in the log, left alone and never loaded; the result says why."""
        path = self.path(key)
        if not path.exists():
            return Restored()
        try:
            kept = restore_state(path, cache_, prompt, identity)
        except (StateFileError, OSError) as exc:
            log.warning("the saved state of %s was not used, the text is read again: %s", key, exc)
            return Restored(refused=str(exc))
        if kept:
            os.utime(path)  # recently used: the last to be evicted
            log.info("restored %d tokens of state for %s", kept, key)
        return Restored(kept)

    def discard(self, key: str) -> None:
        """Delete `key`'s saved state, if any."""
        self.path(key).unlink(missing_ok=True)

    def evict(self) -> None:
        """Delete the least recently used files (saved or restored last longest ago) until
        the folder is within the cap, and what a save cut short (a crash) left behind."""
        for leftover in self.folder.glob("*.part"):
            leftover.unlink(missing_ok=True)
        files = []
        for path in self.folder.glob(f"*{SUFFIX}"):
            try:
                stat = path.stat()
            except OSError:
                continue
            files.append((stat.st_mtime_ns, stat.st_size, path))
        total = sum(size for _, size, _ in files)
        for _, size, path in sorted(files):
            if total <= self.cap_bytes:
                break
            path.unlink(missing_ok=True)
            total -= size
            log.info("dropped the saved state %s to stay under %.1f GB", path.name, self.cap_bytes / 1e9)


@dataclass
class ConversationState:
    """Where one conversation's state is saved, and what a saved file must match to be used."""

    states: SavedStates
    key: str
    identity: Identity
    written: tuple[int, ...] = ()  # the tokens of the last save, which need no second one
    refused: bool = False  # the file was refused: it is not read again, and the next save replaces it

    def save(self, cache_: KVCache) -> bool:
        """Save `cache_` as this conversation's state, unless that was saved already."""
        if cache_.tokens == self.written:
            return False
        saved = self.states.save(self.key, cache_, self.identity)
        self.written = cache_.tokens if saved else ()
        self.refused = self.refused and not saved
        return saved

    def restore(self, cache_: KVCache, prompt: Sequence[int]) -> Restored:
        """Restore this conversation's saved state for `prompt` where it serves (see
        `SavedStates.restore`); the file is not even read when what it was saved with shows
        that the cache holds as much of the prompt already (every later turn), nor once it
        was refused."""
        last = max(len(prompt) - 1, 0)
        if self.refused or (
            self.written and min(matching_tokens(self.written, prompt), last) <= min(cache_.common_prefix(prompt), last)
        ):
            return Restored()
        restored = self.states.restore(self.key, cache_, prompt, self.identity)
        if restored.tokens:
            self.written = cache_.tokens
        self.refused = restored.refused is not None
        return restored
