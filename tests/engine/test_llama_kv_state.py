"""The benchmark's deep llama.cpp contexts (`tools/bench/llama_kv_state.py`, `bench_llama_cpp.py --fill
tiled`): a sequence state is read and tiled as llama.cpp's `state_write`/`state_read` lay it
out, and llama.cpp itself takes the tiled cache and decodes from it."""

import json
import struct
import subprocess

import pytest

from engine.bundled import resolve_model_path
from tests.engine.conftest import ROOT
from tools.bench.llama_kv_state import IO_MAGIC, SEQ_MAGIC, read_sequence_state, write_tiled_sequence_file


def state_bytes(cells: int, layers: int, row: int) -> bytes:
    """A sequence state written by hand after llama.cpp's state_write: key row bytes (c, l, 0, ...)
    and value row bytes (c, l, 1, ...) for cell c of layer l, cells at positions 0 .. cells-1."""
    out = struct.pack("<IiII", IO_MAGIC, 0, 1, cells)
    out += b"".join(struct.pack("<iIi", pos, 1, 0) for pos in range(cells))
    out += struct.pack("<II", 0, layers)
    for kind in (0, 1):
        for layer in range(layers):
            out += struct.pack("<iQ", 1, row)  # type 1: GGML_TYPE_F16
            out += b"".join(bytes([c, layer, kind]) + bytes(row - 3) for c in range(cells))
    return out


def test_a_state_is_read_and_tiled_to_a_deeper_context(tmp_path):
    state = read_sequence_state(state_bytes(cells=3, layers=2, row=8))
    assert state.positions == [0, 1, 2] and [r.ggml_type for r in state.keys + state.values] == [1] * 4
    path = tmp_path / "tiled.ggsq"
    tokens = list(range(100, 108))
    write_tiled_sequence_file(path, state, tokens)
    data = path.read_bytes()
    assert struct.unpack_from("<III8i", data) == (SEQ_MAGIC, 3, 8, *tokens)
    body = struct.pack("<Ii", IO_MAGIC, 0) + data[12 + 4 * 8 :]  # as llama_state_seq_get_data would give it
    tiled = read_sequence_state(body)
    assert tiled.positions == list(range(8))
    for kind, layers in enumerate((tiled.keys, tiled.values)):
        for layer, rows in enumerate(layers):
            firsts = [bytes(rows.data[c * 8 : c * 8 + 3]) for c in range(8)]
            assert firsts == [bytes([c % 3, layer, kind]) for c in range(8)]  # cell c holds cell c % 3


def test_layouts_it_does_not_know_are_refused():
    good = state_bytes(cells=2, layers=1, row=4)
    with pytest.raises(ValueError, match="not understood"):
        read_sequence_state(good + b"\0")
    transposed = bytearray(good)
    struct.pack_into("<I", transposed, 16 + 2 * 12, 1)  # v_trans, after the cells' meta
    with pytest.raises(ValueError, match="transposed"):
        read_sequence_state(bytes(transposed))
    with pytest.raises(ValueError, match="not llama"):
        read_sequence_state(good[4:])


def test_llama_cpp_takes_the_tiled_cache_and_decodes(peer):
    model = str(resolve_model_path("smollm2"))
    command = [peer, str(ROOT / "tools" / "bench" / "bench_llama_cpp.py"), model,
               "--kv-type", "q8_0", "--fill", "tiled", "--prompt-tokens", "600", "--tile-tokens", "128", "--gen-tokens", "2", "--threads", "1",
               "--check-fill", "--json"]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    assert figures["fill_check"] == {"refilled_logits_equal": True, "positions": 600, "decoded_finite": True}
    assert figures["fill"] == "tiled" and figures["prefill_tok_s"] is None
