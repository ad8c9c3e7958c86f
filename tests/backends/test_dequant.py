"""backends.dequant against independent references.

- Every block format: fixtures made by llama.cpp's own C dequantizer (ggml's to_float) on
  random blocks, by tools/fixtures/make_dequant_fixtures.py. The tests only read the committed
  fixtures; they never need llama.cpp.
- Plain float and integer types, and Q1_0: blocks built by hand, values worked out by hand.
"""
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from backends.dequant import block_size, dequantize, dequantize_rows, supported_types
from backends.errors import TensorDataError, UnsupportedTensorType

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "dequant"
FIXTURE_NAMES = sorted(p.stem for p in FIXTURES.glob("*.npz"))

# Element types with one value per "block": checked by hand below (F16 and BF16 have ggml fixtures too).
PLAIN_TYPES = {T.F32, T.F16, T.BF16, T.F64, T.I8, T.I16, T.I32, T.I64}


def load_fixture(name: str) -> tuple[np.ndarray, np.ndarray]:
    with np.load(FIXTURES / f"{name}.npz") as fixture:
        return fixture["raw"], fixture["expected"]


# --- every block format, against ggml ------------------------------------------------------


@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_matches_ggml(name):
    raw, expected = load_fixture(name)
    got = dequantize(raw, T[name], expected.shape)
    assert got.dtype == np.float32 and got.shape == expected.shape
    np.testing.assert_array_equal(got, expected)


def test_every_supported_type_is_checked():
    # Each type supported_types() claims has a ggml fixture or is a plain type checked by hand below.
    checked = {T[name] for name in FIXTURE_NAMES} | PLAIN_TYPES
    claimed = {T(t) for t in supported_types()}
    assert claimed - checked == set(), "claimed without a ggml fixture"
    assert checked - claimed == set(), "checked but not claimed"
    assert T.Q1_0 in claimed


def test_reads_a_memmap_slice(tmp_path):
    raw, expected = load_fixture("Q4_K")
    path = tmp_path / "tensor.bin"
    path.write_bytes(b"\xff" * 7 + raw.tobytes() + b"\xff" * 5)
    mapped = np.memmap(path, dtype=np.uint8, mode="r")
    np.testing.assert_array_equal(dequantize(mapped[7:7 + raw.size], T.Q4_K, expected.shape), expected)


# --- plain types, by hand ------------------------------------------------------------------


@pytest.mark.parametrize(
    "ggml_type, raw, expected",
    [
        # IEEE half, little-endian: 1.0 = 0x3C00, -2.0 = 0xC000, 0.5 = 0x3800, 65504 = 0x7BFF
        (T.F16, bytes.fromhex("003c 00c0 0038 ff7b"), [1.0, -2.0, 0.5, 65504.0]),
        # bfloat16 is the high half of a float32: 1.0 = 0x3F80, -2.0 = 0xC000, 0.5 = 0x3F00
        (T.BF16, bytes.fromhex("803f 00c0 003f 0000"), [1.0, -2.0, 0.5, 0.0]),
        # float32: 1.0 = 0x3F800000, -0.25 = 0xBE800000
        (T.F32, bytes.fromhex("0000803f 000080be"), [1.0, -0.25]),
        (T.F64, struct.pack("<3d", 1.5, -3.0, 1e10), [1.5, -3.0, 1e10]),
        (T.I8, struct.pack("<3b", -128, 127, 0), [-128.0, 127.0, 0.0]),
        (T.I16, struct.pack("<3h", -32768, 32767, 5), [-32768.0, 32767.0, 5.0]),
        (T.I32, struct.pack("<3i", -(2**31), 2**24, -7), [-(2.0**31), 2.0**24, -7.0]),
        (T.I64, struct.pack("<3q", -(2**40), 3, 0), [-(2.0**40), 3.0, 0.0]),
    ],
    ids=lambda v: v.name if isinstance(v, T) else "",
)
def test_plain_types(ggml_type, raw, expected):
    got = dequantize(np.frombuffer(raw, dtype=np.uint8), ggml_type, (len(expected),))
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, np.array(expected, dtype=np.float32))


# --- Q1_0, by hand -------------------------------------------------------------------------


def q1_0_block(d_hex: str, qs: list[int]) -> bytes:
    """One Q1_0 block: d as 4 hex digits of its fp16 bits, then the 16 bit-bytes."""
    assert len(qs) == 16
    return bytes.fromhex(d_hex)[::-1] + bytes(qs)  # fp16 stored little-endian


def test_q1_0_block_size_is_128_weights_in_18_bytes():
    assert block_size(T.Q1_0) == (128, 18)


def test_q1_0_bits_least_significant_first():
    # d = 0.5 (fp16 0x3800). qs[0] = 0b10100101: bits 0..7 are 1,0,1,0,0,1,0,1.
    # qs[1] = 0xFF: all +d. qs[2..14] = 0: all -d. qs[15] = 0x80: only its bit 7, weight 127, is +d.
    block = q1_0_block("3800", [0b10100101, 0xFF] + [0] * 13 + [0x80])
    expected = (
        [0.5, -0.5, 0.5, -0.5, -0.5, 0.5, -0.5, 0.5]
        + [0.5] * 8
        + [-0.5] * (13 * 8)
        + [-0.5] * 7 + [0.5]
    )
    got = dequantize(np.frombuffer(block, dtype=np.uint8), T.Q1_0, (128,))
    np.testing.assert_array_equal(got, np.array(expected, dtype=np.float32))


def test_q1_0_negative_scale_flips_every_sign():
    # d = -2.0 (fp16 0xC000); qs[0] = 0b00000011: weights 0 and 1 are +d = -2, the rest -d = +2.
    block = q1_0_block("c000", [0b00000011] + [0] * 15)
    got = dequantize(np.frombuffer(block, dtype=np.uint8), T.Q1_0, (128,))
    np.testing.assert_array_equal(got, np.array([-2.0, -2.0] + [2.0] * 126, dtype=np.float32))


def test_q1_0_zero_scale_gives_zeros():
    block = q1_0_block("0000", [0x5A] * 16)
    got = dequantize(np.frombuffer(block, dtype=np.uint8), T.Q1_0, (128,))
    np.testing.assert_array_equal(got, np.zeros(128, dtype=np.float32))


def test_q1_0_several_blocks_in_two_rows():
    # Four blocks, each qs byte 0x01: in every group of 8 weights, the first is +d, the other seven -d.
    # Scales: 1.0 (0x3C00), 0.25 (0x3400), -1.0 (0xBC00), 3.0 (0x4200). Row 0 = blocks 0-1, row 1 = blocks 2-3.
    scales = {"3c00": 1.0, "3400": 0.25, "bc00": -1.0, "4200": 3.0}
    raw = b"".join(q1_0_block(d_hex, [0x01] * 16) for d_hex in scales)
    expected = np.concatenate([np.tile([d] + [-d] * 7, 16) for d in scales.values()]).reshape(2, 256)
    got = dequantize(np.frombuffer(raw, dtype=np.uint8), T.Q1_0, (2, 256))
    np.testing.assert_array_equal(got, expected.astype(np.float32))


def test_q1_0_large_tensor_spans_several_passes():
    # More blocks than one pass of the vectorised loop: the block with d = 1.0 and all bits set
    # (+1 everywhere) is repeated, and one block near the end is d = 1.0 with no bits set (-1 everywhere).
    n_blocks = 10_000
    ones = q1_0_block("3c00", [0xFF] * 16)
    minus = q1_0_block("3c00", [0x00] * 16)
    raw = ones * (n_blocks - 2) + minus + ones
    got = dequantize(np.frombuffer(raw, dtype=np.uint8), T.Q1_0, (n_blocks, 128))
    expected = np.ones((n_blocks, 128), dtype=np.float32)
    expected[-2] = -1.0
    np.testing.assert_array_equal(got, expected)


# --- dequantize_rows -----------------------------------------------------------------------


def random_tensor(ggml_type: T, n_rows: int, blocks_per_row: int) -> tuple[np.ndarray, tuple[int, int]]:
    """Random bytes for an (n_rows, n_cols) tensor of a type whose floats sit at even offsets.

    Bit 6 of every odd byte is cleared: that caps the exponent of every little-endian fp16
    (and fp32) at even offsets, so the values stay finite.
    """
    weights, size = block_size(ggml_type)
    raw = np.random.default_rng(int(ggml_type)).integers(0, 256, n_rows * blocks_per_row * size, dtype=np.uint8)
    raw[1::2] &= 0b1011_1111
    return raw, (n_rows, blocks_per_row * weights)


@pytest.mark.parametrize("ggml_type", [T.Q1_0, T.Q4_K, T.Q8_0, T.F16, T.F32], ids=lambda t: t.name)
@pytest.mark.parametrize(
    "rows",
    [slice(2, 5), slice(1, 7, 3), slice(6, 7), np.array([5, 0, 5, 3]), np.array([[1, 2], [6, 0]])],
    ids=["slice", "strided-slice", "last-row", "index-array", "2-D-index-array"],
)
def test_rows_equal_slices_of_the_whole_tensor(ggml_type, rows):
    raw, shape = random_tensor(ggml_type, n_rows=7, blocks_per_row=3)
    whole = dequantize(raw, ggml_type, shape)
    np.testing.assert_array_equal(dequantize_rows(raw, ggml_type, shape, rows), whole[rows])


GUARDED_ROWS_SCRIPT = r"""
import ctypes, math, mmap
import numpy as np
from backends.dequant import block_size, dequantize_rows

libc = ctypes.CDLL(None, use_errno=True)
libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
PROT_NONE = 0
for ggml_type in (41, 12, 0):  # Q1_0 (our code), Q4_K (gguf-py), F32 (a view)
    weights, size = block_size(ggml_type)
    blocks_per_row = mmap.PAGESIZE // math.gcd(size, mmap.PAGESIZE)
    row_bytes = blocks_per_row * size  # a whole number of pages
    data = np.frombuffer(mmap.mmap(-1, 5 * row_bytes), dtype=np.uint8)  # zero bytes, page-aligned
    for row in (0, 2, 4):  # any read of these rows kills the process with SIGSEGV
        address = data.ctypes.data + row * row_bytes
        if libc.mprotect(ctypes.c_void_p(address), row_bytes, PROT_NONE) != 0:
            raise OSError(ctypes.get_errno(), "mprotect failed")
    shape = (5, blocks_per_row * weights)
    assert dequantize_rows(data, ggml_type, shape, np.array([3, 1, 3])).shape == (3, shape[1])
    assert dequantize_rows(data, ggml_type, shape, slice(1, 4, 2)).shape == (2, shape[1])
print("only the requested rows were read")
"""


@pytest.mark.skipif(sys.platform == "win32", reason="uses POSIX mprotect")
def test_rows_reads_only_the_requested_rows():
    # Rows 0, 2 and 4 of a memory area are made unreadable; asking for rows 1 and 3 must not crash.
    result = subprocess.run(
        [sys.executable, "-c", GUARDED_ROWS_SCRIPT], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, f"dequantize_rows read outside the requested rows:\n{result.stderr}"


def test_rows_needs_a_2d_shape():
    raw, _ = random_tensor(T.Q8_0, n_rows=4, blocks_per_row=1)
    with pytest.raises(TensorDataError, match="2-D"):
        dequantize_rows(raw, T.Q8_0, (2, 2, 32), slice(0, 1))


# --- errors and type table -----------------------------------------------------------------


def test_wrong_byte_length_is_a_clear_error():
    raw, expected = load_fixture("Q4_K")
    with pytest.raises(TensorDataError, match=rf"Q4_K tensor of shape \(2, 512\) takes {raw.size} bytes, but {raw.size - 1}"):
        dequantize(raw[:-1], T.Q4_K, expected.shape)
    with pytest.raises(TensorDataError, match="takes"):
        dequantize_rows(raw[:-1], T.Q4_K, expected.shape, slice(0, 1))


def test_row_not_a_multiple_of_the_block_is_a_clear_error():
    with pytest.raises(TensorDataError, match="multiple of 128"):
        dequantize(np.zeros(18, dtype=np.uint8), T.Q1_0, (1, 64))


@pytest.mark.parametrize("ggml_type", [T.Q8_1, T.Q8_K], ids=lambda t: t.name)
def test_types_gguf_py_cannot_dequantize_are_refused(ggml_type):
    weights, size = block_size(ggml_type)
    assert int(ggml_type) not in supported_types()
    with pytest.raises(UnsupportedTensorType, match=ggml_type.name):
        dequantize(np.zeros(size, dtype=np.uint8), ggml_type, (weights,))


def test_unknown_type_id_is_refused():
    with pytest.raises(UnsupportedTensorType, match="unknown GGML tensor type 999"):
        dequantize(np.zeros(4, dtype=np.uint8), 999, (1,))
    with pytest.raises(UnsupportedTensorType):
        block_size(999)
