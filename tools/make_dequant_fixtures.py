"""Regenerate tests/fixtures/dequant/<TYPE>.npz with llama.cpp's own dequantizer.

Run it with the reference venv, where llama-cpp-python is installed:

    /work/refvenv/bin/python tools/make_dequant_fixtures.py

For each type, it draws a few random blocks and passes them to ggml's C dequantizer,
`ggml_get_type_traits(type)->to_float`, in the libggml-base library that
llama-cpp-python ships. Each fixture holds `raw` (the blocks, uint8) and `expected`
(ggml's float32 output, shape (2, n_cols)). tests/backends/test_dequant.py compares
backends.dequant against them; the tests never need llama-cpp-python.

The blocks are random bytes, except the fields that hold floating-point scales: those
are set to finite values of moderate size, so that no output is NaN or infinite.
"""
import ctypes
import importlib.metadata
import importlib.util
from pathlib import Path

import numpy as np

OUT_DIR = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "dequant"

# name: (GGML type id, scale fields as (kind, byte offset in the block)).
# Offsets follow the block structs in ggml/src/ggml-common.h.
FORMATS = {
    "F16": (1, [("f16", 0)]),
    "BF16": (30, [("bf16", 0)]),
    "Q4_0": (2, [("f16", 0)]),
    "Q4_1": (3, [("f16", 0), ("f16", 2)]),
    "Q5_0": (6, [("f16", 0)]),
    "Q5_1": (7, [("f16", 0), ("f16", 2)]),
    "Q8_0": (8, [("f16", 0)]),
    "Q2_K": (10, [("f16", 80), ("f16", 82)]),
    "Q3_K": (11, [("f16", 108)]),
    "Q4_K": (12, [("f16", 0), ("f16", 2)]),
    "Q5_K": (13, [("f16", 0), ("f16", 2)]),
    "Q6_K": (14, [("f16", 208)]),
    "IQ2_XXS": (16, [("f16", 0)]),
    "IQ2_XS": (17, [("f16", 0)]),
    "IQ3_XXS": (18, [("f16", 0)]),
    "IQ1_S": (19, [("f16", 0)]),
    "IQ4_NL": (20, [("f16", 0)]),
    "IQ3_S": (21, [("f16", 0)]),
    "IQ2_S": (22, [("f16", 0)]),
    "IQ4_XS": (23, [("f16", 0)]),
    "IQ1_M": (29, [("iq1_m_f16", 48)]),
    "TQ1_0": (34, [("f16", 52)]),
    "TQ2_0": (35, [("f16", 64)]),
    "MXFP4": (39, [("e8m0", 0)]),
    "NVFP4": (40, []),  # four UE4M3 scales: every byte value decodes to a finite number
    "Q1_0": (41, [("f16", 0)]),
}


class TypeTraits(ctypes.Structure):
    """struct ggml_type_traits, as declared in ggml.h."""

    _fields_ = [
        ("type_name", ctypes.c_char_p),
        ("blck_size", ctypes.c_int64),
        ("blck_size_interleave", ctypes.c_int64),
        ("type_size", ctypes.c_size_t),
        ("is_quantized", ctypes.c_bool),
        ("to_float", ctypes.c_void_p),
        ("from_float_ref", ctypes.c_void_p),
    ]


# typedef void (*ggml_to_float_t)(const void * x, float * y, int64_t k);
ToFloat = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.POINTER(ctypes.c_float), ctypes.c_int64)


def load_ggml() -> ctypes.CDLL:
    """libggml-base from the installed llama-cpp-python, without importing llama_cpp."""
    package_dir = Path(importlib.util.find_spec("llama_cpp").submodule_search_locations[0])
    (library,) = [p for p in (package_dir / "lib").glob("libggml-base.*") if p.suffix in (".so", ".dylib")]
    ggml = ctypes.CDLL(str(library))
    ggml.ggml_get_type_traits.argtypes = [ctypes.c_int]
    ggml.ggml_get_type_traits.restype = ctypes.POINTER(TypeTraits)
    return ggml


def random_blocks(rng: np.random.Generator, n_blocks: int, type_size: int, scales) -> np.ndarray:
    """(n_blocks, type_size) random bytes whose scale fields hold finite, moderate values."""
    blocks = rng.integers(0, 256, size=(n_blocks, type_size), dtype=np.uint8)
    for kind, offset in scales:
        magnitude = rng.uniform(0.01, 2.0, size=n_blocks) * rng.choice([-1.0, 1.0], size=n_blocks)
        if kind == "f16":
            blocks[:, offset:offset + 2] = magnitude.astype(np.float16).view(np.uint8).reshape(n_blocks, 2)
        elif kind == "bf16":  # the high half of a float32
            high = (magnitude.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
            blocks[:, offset:offset + 2] = high.view(np.uint8).reshape(n_blocks, 2)
        elif kind == "e8m0":  # a power of two, 2**(e - 128) as ggml decodes it
            blocks[:, offset] = rng.integers(118, 136, size=n_blocks)
        elif kind == "iq1_m_f16":  # the fp16 scale lives in the top nibbles of four uint16 scales
            bits = magnitude.astype(np.float16).view(np.uint16)
            scales16 = blocks[:, offset:offset + 8].copy().view(np.uint16)  # (n_blocks, 4)
            for i in range(4):
                nibble = (bits >> (4 * i)) & 0xF
                scales16[:, i] = (scales16[:, i] & 0x0FFF) | (nibble << 12)
            blocks[:, offset:offset + 8] = scales16.view(np.uint8)
        else:
            raise ValueError(f"unknown scale kind {kind}")
    return blocks


def ggml_dequantize(ggml: ctypes.CDLL, type_id: int, name: str, raw: np.ndarray, n_values: int) -> np.ndarray:
    """ggml's to_float for type_id over the bytes `raw`."""
    traits = ggml.ggml_get_type_traits(type_id).contents
    assert traits.type_name.decode().upper() == name, (traits.type_name, name)
    assert traits.to_float, f"ggml has no to_float for {name}"
    out = np.empty(n_values, dtype=np.float32)
    ToFloat(traits.to_float)(raw.ctypes.data, out.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), n_values)
    return out


def main() -> None:
    ggml = load_ggml()
    source = f"ggml to_float from llama-cpp-python {importlib.metadata.version('llama-cpp-python')}"
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    for name, (type_id, scales) in FORMATS.items():
        traits = ggml.ggml_get_type_traits(type_id).contents
        block, type_size = traits.blck_size, traits.type_size
        n_cols = max(2 * block, 32)  # two rows of at least two blocks
        n_blocks = 2 * n_cols // block
        rng = np.random.default_rng([20240601, type_id])
        raw = random_blocks(rng, n_blocks, type_size, scales).reshape(-1)  # (n_blocks * type_size,)
        expected = ggml_dequantize(ggml, type_id, name, raw, 2 * n_cols).reshape(2, n_cols)  # (rows, n_cols)
        assert np.isfinite(expected).all(), f"{name}: non-finite values; fix its scale fields"
        np.savez(OUT_DIR / f"{name}.npz", raw=raw, expected=expected, source=np.array(source))
        print(f"{name:8} type {type_id:2}: {n_blocks} blocks, {raw.size} bytes -> {expected.shape}")


if __name__ == "__main__":
    main()
