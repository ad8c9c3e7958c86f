"""One sequence's KV cache state as llama.cpp writes it, read, and tiled to a deeper context.

A decode step over N positions costs llama.cpp the same whatever its cached keys and values
hold, but the only way its API offers to N positions is a prefill of N tokens: tens of
minutes at 16k tokens of a 4B model on two cores. So `tools/bench/bench_llama_cpp.py --fill tiled`
prefills a short prompt for real, takes its sequence state (`llama_state_seq_get_data`),
repeats its cells to N positions (cell i holds what the prefill's cell i % P held, at
position i) and loads that (`llama_state_seq_load_file`): llama.cpp then holds N cells of
the right types at positions 0 .. N-1 and decodes from there. Sprig's counterpart is
`engine bench --fill random`.

The layout, from llama.cpp's `src/llama-kv-cache.cpp` (`state_write`, `state_write_meta`,
`state_write_data`), for one sequence of a text model (no per-cell "ext": no M-RoPE, no
per-layer n-gram embeddings), all little-endian:

    u32 0xaf143cd8 | i32 seq_id                    (`llama_state_seq_get_data`'s buffer only, from
                                                   `llama_context::state_seq_get_data`; not in a file)
    u32 n_stream                                   1 unless the context keeps a stream per sequence
    per stream:
      u32 cell_count
      per cell:  i32 pos | u32 n_seq_id (1) | i32 seq_id
      u32 v_trans | u32 n_layer
      per layer: i32 k_type | u64 k_row_bytes | cell_count rows of keys
      per layer: i32 v_type | u64 v_row_bytes | cell_count rows of values     (v_trans 0)

Values are stored transposed (one row per channel) when flash attention is off: that form is
refused here, and `--fill tiled` turns flash attention on. A sequence file
(`llama_state_seq_save_file`) is u32 magic "ggsq" | u32 version (3) | u32 n_tokens | i32
tokens, then the layout above. Reading checks that the whole buffer is used, so a layout
with parts this reader does not know is refused, not misread.
"""

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

SEQ_MAGIC = 0x67677371  # 'ggsq', LLAMA_STATE_SEQ_MAGIC
SEQ_VERSION = 3  # LLAMA_STATE_SEQ_VERSION of llama.cpp as vendored by llama-cpp-python 0.3.36
IO_MAGIC = 0xAF143CD8  # what `llama_state_seq_get_data` writes first (llama-context.cpp's io_magic)


@dataclass
class Rows:
    """One layer's keys or values: their ggml type, the bytes of one cell's row, and every cell's rows."""

    ggml_type: int
    row_bytes: int
    data: memoryview  # (cells, row_bytes), a view of the state's buffer


@dataclass
class SequenceState:
    """A sequence's cells: their positions and each layer's keys and values."""

    positions: list[int]
    keys: list[Rows]
    values: list[Rows]


class _Reader:
    def __init__(self, data: bytes):
        self.data, self.at = memoryview(data), 0

    def take(self, fmt: str) -> tuple:
        values = struct.unpack_from(fmt, self.data, self.at)
        self.at += struct.calcsize(fmt)
        return values

    def rows(self, cells: int) -> Rows:
        ggml_type, row_bytes = self.take("<iQ")
        size = cells * row_bytes
        if self.at + size > len(self.data):
            raise ValueError("the state ends inside a layer's rows")
        rows = Rows(ggml_type, row_bytes, self.data[self.at : self.at + size])
        self.at += size
        return rows


def read_sequence_state(data: bytes) -> SequenceState:
    """Parse `llama_state_seq_get_data`'s bytes; ValueError for a layout this module does not cover."""
    reader = _Reader(data)
    magic, _seq_id = reader.take("<Ii")
    if magic != IO_MAGIC:
        raise ValueError(f"the state begins with {magic:#x}, not llama.cpp's {IO_MAGIC:#x}")
    (n_stream,) = reader.take("<I")
    if n_stream != 1:
        raise ValueError(f"the state has {n_stream} streams; one is read here")
    (cells,) = reader.take("<I")
    positions = []
    for _ in range(cells):
        pos, n_seq = reader.take("<iI")
        if n_seq != 1:
            raise ValueError(f"a cell belongs to {n_seq} sequences")
        reader.take("<i")
        positions.append(pos)
    v_trans, n_layer = reader.take("<II")
    if v_trans:
        raise ValueError("the values are stored transposed (flash attention off); turn flash attention on")
    keys = [reader.rows(cells) for _ in range(n_layer)]
    values = [reader.rows(cells) for _ in range(n_layer)]
    if reader.at != len(data):
        raise ValueError(f"{len(data) - reader.at} bytes of the state were not understood")
    return SequenceState(positions, keys, values)


def _write_tiled(f: BinaryIO, rows: Rows, cells: int) -> None:
    """Write `rows`' cells repeated to `cells` cells, one copy of them at a time."""
    whole, rest = divmod(cells, len(rows.data) // rows.row_bytes)
    for _ in range(whole):
        f.write(rows.data)
    f.write(rows.data[: rest * rows.row_bytes])


def write_tiled_sequence_file(path: Path, state: SequenceState, tokens: list[int]) -> int:
    """Write a sequence file holding `len(tokens)` cells at positions 0 .. n-1, cell i with
    the keys and values of `state`'s cell i % len(state.positions); return its size in bytes.
    The rows go to the file straight from `state`'s buffer, so that filling a deep context
    leaves nothing of its size in this process's memory (its RSS is measured)."""
    cells = len(tokens)
    with open(path, "wb") as f:
        f.write(struct.pack("<III", SEQ_MAGIC, SEQ_VERSION, cells))
        f.write(struct.pack(f"<{cells}i", *tokens))
        f.write(struct.pack("<II", 1, cells))
        f.write(b"".join(struct.pack("<iIi", pos, 1, 0) for pos in range(cells)))
        f.write(struct.pack("<II", 0, len(state.keys)))
        for rows in [*state.keys, *state.values]:
            f.write(struct.pack("<iQ", rows.ggml_type, rows.row_bytes))
            _write_tiled(f, rows, cells)
        return f.tell()
