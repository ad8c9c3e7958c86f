"""The native CPU kernels on random GGUF blocks.

- The portable (scalar) kernels unpack every block exactly as gguf-py dequantizes it:
  random bytes with finite fp16 scales, extreme scales, all bits set, all zeros, and
  gguf-py's own quantization where it has one (legacy types, TQ1_0, TQ2_0); MXFP4 too, whose
  E8M0 scale byte runs from 2^-128, a subnormal, to 2^127.
- Every type of the table is multiplied where the file's memory map holds it.
- Every tier this machine runs (AVX2, AVX-512, NEON) gives the scalar tier's products bit
  for bit, for T = 1..16 tokens, 1-3 threads, odd row counts, extreme and zero scales
  and blocks with every bit set.
- A product is x @ W.T within the error that quantizing x in groups of 32 allows (of 256 for
  Q4_K, Q5_K and Q6_K; a bound worked out per element from the data), W dequantized by gguf-py: codes up to 32767 for
  the integer kernels, up to 2047 for Q1_0's lookup tables, up to 1023 for the ternary
  types' (TQ1_0, TQ2_0), up to 127 for Q2_K's and Q3_K's 8-bit codes. The float types
  take float activations: within float rounding. The quantized types take codes in products over
  32 tokens or more (prefill) too, and the types on int16 codes give a token the same
  bits whatever tokens are multiplied beside it.
"""

from pathlib import Path

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, quants

from backends import cpu_backend, cpu_native
from backends.base import WeightSpec
from backends.cpu_backend import CpuBackend, CpuMatrix, _bufs
from backends.dequant import dequantize
from backends.errors import BackendUnavailable
from tools.fixtures.make_iq_grids import HEADER, grid_values, render

T = GGMLQuantizationType
# Byte offsets of each block's fp16 scales (d, and m or dmin where the type has one).
SCALE_OFFSETS = {
    T.Q4_0: (0,), T.Q4_1: (0, 2), T.Q5_0: (0,), T.Q5_1: (0, 2), T.Q8_0: (0,), T.Q1_0: (0,),
    T.Q4_K: (0, 2), T.Q5_K: (0, 2), T.Q6_K: (208,),
    T.Q2_K: (80, 82), T.Q3_K: (108,), T.TQ2_0: (64,), T.TQ1_0: (52,), T.IQ4_NL: (0,), T.IQ4_XS: (0,),
    T.IQ3_XXS: (0,), T.IQ3_S: (0,), T.IQ2_XXS: (0,), T.IQ2_XS: (0,), T.IQ2_S: (0,), T.IQ1_S: (0,),
    T.IQ1_M: (48,),  # IQ1_M's d is the top 4 bits of the 4 words at 48 (put_scales)
}
# Types whose scale is an E8M0 byte at offset 0 (a power of two, finite for every byte).
E8M0_TYPES = (T.MXFP4,)
E8M0_EXTREMES = np.array([0, 1, 2, 127, 128, 253, 254, 255], dtype=np.uint8)
QUANT_TYPES = sorted([*SCALE_OFFSETS, *E8M0_TYPES], key=int)
FLOAT_TYPES = [T.F32, T.F16, T.BF16]
# Q1_0's tables sum 12-bit codes, the ternary types' tables 11-bit codes
# 7 bits (+ sign) for the types on 8-bit codes (cpu_kernels/codes8_dots.c), 15 for the others
CODES8_TYPES = (T.Q2_K, T.Q3_K, T.IQ4_XS, T.IQ3_XXS, T.IQ3_S, T.IQ2_XXS, T.IQ2_XS, T.IQ2_S, T.IQ1_S, T.IQ1_M)
CODE_MAX = {t: {T.Q1_0: 2047, T.TQ1_0: 1023, T.TQ2_0: 1023}.get(t, 127 if t in CODES8_TYPES else 32767) for t in QUANT_TYPES}
TABLE_TYPES = (T.Q1_0, T.TQ1_0, T.TQ2_0)  # multiplied by table lookup, from tiles of 32 rows
# activation codes with one scale per 256 for any count of tokens: in row tiles (dense matrices), and as the
# file has the rows (a mixture's experts: cpu_kernels/int16_panels.c)
INT16_DECODE_TYPES = (T.Q4_K, T.Q5_K, T.Q6_K)
# the types multiplied from tiles of 8 rows, a row per vector lane, for any count of tokens
# (cpu_kernels/row_tiles.c): on int16 codes (per 32; per 256 for Q4_K and Q6_K), and Q2_K on 8-bit ones;
# Q5_K's rows as the file has them
ROW_TILED_TYPES = (T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.IQ4_NL, T.MXFP4, T.Q4_K, T.Q6_K, T.Q2_K)
INT16_CODES_TYPES = tuple(sorted({*ROW_TILED_TYPES, *INT16_DECODE_TYPES} - {*CODES8_TYPES}, key=int))  # every type on int16 codes
# the types whose products take the same activation codes for any count of tokens
SAME_CODES_TYPES = tuple(sorted({*ROW_TILED_TYPES, *INT16_DECODE_TYPES}, key=int))
GGUF_PY_QUANTIZES = {T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.TQ1_0, T.TQ2_0}  # gguf.quants.quantize
EXTREME_SCALES = np.array([65504.0, -65504.0, 6e-8, 0.0, 1.0, -0.5], dtype=np.float16)
TIERS = cpu_native.runnable_tiers()


def random_matrix(qtype: T, rows: int, cols: int, rng: np.random.Generator, kind: str = "random") -> np.ndarray:
    """(rows, bytes per row) uint8 blocks: random bytes, with finite fp16 scales.

    kind "random": scales ~ N(0, 0.05) (E8M0: 2^-12 .. 2^0); "extreme": scales drawn from
    EXTREME_SCALES (E8M0: E8M0_EXTREMES); "ones": every byte 0xFF except the fp16 scales (an
    E8M0 byte 0xFF too: 2^127, whose largest codes dequantize to inf); "zeros": every byte 0;
    "quantized": gguf-py's own blocks for standard normal values (the types gguf-py can
    quantize; random otherwise).
    """
    if qtype in FLOAT_TYPES:
        values = rng.standard_normal((rows, cols)).astype(np.float32)
        if qtype == T.F16:
            return values.astype(np.float16).view(np.uint8)
        if qtype == T.BF16:
            return (values.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
        return values.view(np.uint8)
    per_block, block_bytes = GGML_QUANT_SIZES[qtype]
    n_blocks = rows * cols // per_block
    if kind == "zeros":
        return np.zeros((rows, n_blocks // rows * block_bytes), dtype=np.uint8)
    if kind == "quantized" and qtype in GGUF_PY_QUANTIZES:
        return quants.quantize(rng.standard_normal((rows, cols)).astype(np.float32), qtype)
    if kind == "ones":
        blocks = np.full((n_blocks, block_bytes), 0xFF, dtype=np.uint8)
    else:
        blocks = rng.integers(0, 256, size=(n_blocks, block_bytes), dtype=np.uint8)
    if qtype in E8M0_TYPES:
        if kind == "random":
            blocks[:, 0] = rng.integers(116, 129, size=n_blocks)
        elif kind == "extreme":
            blocks[:, 0] = rng.choice(E8M0_EXTREMES, size=n_blocks)
        return blocks.reshape(rows, -1)
    for offset in SCALE_OFFSETS[qtype]:
        if kind == "extreme":
            scales = rng.choice(EXTREME_SCALES, size=n_blocks)
        else:
            scales = (0.05 * rng.standard_normal(n_blocks)).astype(np.float16)
        put_scales(blocks, qtype, offset, scales)
    return blocks.reshape(rows, -1)  # (rows, n_blocks_per_row * block_bytes)


def put_scales(blocks: np.ndarray, qtype: T, offset: int, scales: np.ndarray) -> None:
    """Write one fp16 scale per block (blocks: (n_blocks, block bytes)) at `offset`; IQ1_M's
    goes 4 bits at a time into the top of the four 16-bit words there (its d, as ggml packs it)."""
    bits = scales.astype(np.float16).view(np.uint16)  # (n_blocks,)
    if qtype != T.IQ1_M:
        blocks[:, offset:offset + 2] = bits.view(np.uint8).reshape(-1, 2)
        return
    words = blocks[:, offset:offset + 8].copy().view(np.uint16)  # (n_blocks, 4)
    for i in range(4):
        words[:, i] = (words[:, i] & 0x0FFF) | (((bits >> (4 * i)) & 0xF) << 12)
    blocks[:, offset:offset + 8] = words.view(np.uint8)


def product(tier: str, threads: int, qtype: T, raw: np.ndarray, cols: int, x: np.ndarray) -> np.ndarray:
    backend = CpuBackend(threads=threads, tier=tier)
    return backend.linear(x, CpuMatrix("w", raw.reshape(-1), int(qtype), raw.shape[0], cols))


def row_product(tier: str, threads: int, qtype: T, raw: np.ndarray, cols: int, x: np.ndarray) -> np.ndarray:
    """The kernels' matrix product on the rows as the file has them, never regrouped into tiles
    (dot_row_tokens: what a mixture's experts take)."""
    backend = CpuBackend(threads=threads, tier=tier)
    out = np.empty((len(x), raw.shape[0]), dtype=np.float32)
    entry = (raw.reshape(-1), int(qtype), raw.shape[0], cols, out, None)
    backend._emit("linear", _bufs(a=np.ascontiguousarray(x)), (entry,), tokens=len(x))
    return out


def test_every_native_type_is_covered():
    assert {int(t) for t in QUANT_TYPES + FLOAT_TYPES} == CpuBackend(threads=1).native_types


@pytest.mark.parametrize("tier", TIERS)
def test_each_tier_exports_the_one_table_of_types_with_gguf_names_and_block_sizes(tier):
    """The kernels' table (QUANT_TYPES in kernels.h) is the only list of native types: every
    tier exports the same one, its names and numbers are gguf-py's, its block sizes are
    gguf-py's, and the backend's types are read from it."""
    module = cpu_native.load(tier)
    table = module.NATIVE_TYPES  # {GGML number: name}
    assert table == cpu_native.load("scalar").NATIVE_TYPES
    assert {number: T(number).name for number in table} == table
    assert CpuBackend(threads=1, tier=tier).native_types == frozenset(table)
    infinity = {T.F32: np.float32(np.inf).tobytes(), T.BF16: np.float32(np.inf).tobytes()[2:]}
    for number in table:
        qtype = T(number)
        size = GGML_QUANT_SIZES[qtype][1]
        blocks = np.zeros(3 * size, dtype=np.uint8)  # blocks of gguf-py's size: count_bad_scales reads 3 of them
        assert module.count_bad_scales(blocks, number, 3) == 0
        with pytest.raises(ValueError, match="smaller than the op needs"):
            module.count_bad_scales(blocks[:-1], number, 3)
        if qtype in E8M0_TYPES:  # every scale byte is a finite power of two: nothing to refuse
            assert module.count_bad_scales(np.full(3 * size, 0xFF, dtype=np.uint8), number, 3) == 0
            continue
        for offset in SCALE_OFFSETS.get(qtype, (0,)):  # each fp16 scale (or the float itself), made infinite
            damaged = blocks.copy()
            if qtype in infinity:
                bad = infinity[qtype]
                damaged[size + offset : size + offset + len(bad)] = np.frombuffer(bad, dtype=np.uint8)
            else:
                put_scales(damaged.reshape(3, size)[1:2], qtype, offset, np.array([np.inf]))
            assert module.count_bad_scales(damaged, number, 3) == 1, (qtype.name, offset)


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")  # MXFP4's 12 * 2^127: inf, as ours
@pytest.mark.parametrize("kind", ["random", "extreme", "ones", "zeros", "quantized"])
@pytest.mark.parametrize("qtype", QUANT_TYPES + FLOAT_TYPES, ids=lambda t: t.name)
def test_scalar_unpacking_matches_gguf_py(qtype, kind):
    rng = np.random.default_rng(int(qtype))
    rows, cols = 5, 512
    raw = random_matrix(qtype, rows, cols, rng, kind)
    backend = CpuBackend(threads=1, tier="scalar")
    matrix = CpuMatrix("w", raw.reshape(-1), int(qtype), rows, cols)
    ours = backend.embedding(matrix, np.arange(rows))
    reference = dequantize(raw.reshape(-1), int(qtype), (rows, cols))
    np.testing.assert_array_equal(ours, reference)


@pytest.mark.parametrize("tier", [t for t in TIERS if t != "scalar"] or
                         [pytest.param("none", marks=pytest.mark.skip(reason="this CPU runs only the scalar tier"))])
@pytest.mark.parametrize("qtype", QUANT_TYPES + FLOAT_TYPES, ids=lambda t: t.name)
def test_every_tier_matches_scalar_bit_for_bit(tier, qtype):
    rng = np.random.default_rng(100 + int(qtype))
    cols = 768 if GGML_QUANT_SIZES[qtype][0] != 256 else 1024
    for kind in ("random", "extreme", "ones", "quantized"):
        cases = [(7, 1, 1), (33, 2, 2), (64, 3, 3), (5, 7, 2), (31, 16, 3), (96, 11, 1), (13, 40, 2), (8, 32, 3)]
        cases.append((10, 39, 2))  # float products: blocks of tokens, then a pair and a single one
        for rows, n_tokens, threads in cases:
            raw = random_matrix(qtype, rows, cols, rng, kind)
            x = rng.standard_normal((n_tokens, cols)).astype(np.float32)
            x[0, :32] *= 1000.0  # one group with a large scale
            x[-1, 32:64] = 0.0  # one all-zero group
            expected = product("scalar", 1, qtype, raw, cols, x)
            got = product(tier, threads, qtype, raw, cols, x)
            np.testing.assert_array_equal(got, expected, err_msg=f"{kind} rows={rows} T={n_tokens} threads={threads}")


@pytest.mark.parametrize("tier", [t for t in TIERS if t != "scalar"] or
                         [pytest.param("none", marks=pytest.mark.skip(reason="this CPU runs only the scalar tier"))])
@pytest.mark.parametrize("qtype", [t for t in QUANT_TYPES if GGML_QUANT_SIZES[t][0] == 32], ids=lambda t: t.name)
def test_rows_of_single_group_blocks_of_any_count_match_scalar_bit_for_bit(tier, qtype):
    """The types whose blocks are single groups, as the file lays out their rows (a mixture's
    experts), are taken in pairs of blocks by the AVX-512 tier's products (quants.c's pair_terms),
    and IQ4_NL 8 and then 2 at a time by the x86 tiers (iq_dots.c): rows of 79 groups (9 runs of
    8, 3 pairs, one alone) and of 3 groups give the scalar tier's bits, for up to 33 tokens; and
    so do their row tiles."""
    rng = np.random.default_rng(7)
    for cols in (79 * 32, 3 * 32):
        for n_tokens in (1, 2, 3, 4, 7, 33):
            raw = random_matrix(qtype, 9, cols, rng)
            x = rng.standard_normal((n_tokens, cols)).astype(np.float32)
            for multiply in (row_product, product):
                expected = multiply("scalar", 1, qtype, raw, cols, x)
                np.testing.assert_array_equal(multiply(tier, 2, qtype, raw, cols, x), expected,
                                              err_msg=f"{multiply.__name__} {cols=} T={n_tokens}")


@pytest.mark.parametrize("tier", [t for t in TIERS if t != "scalar"] or
                         [pytest.param("none", marks=pytest.mark.skip(reason="this CPU runs only the scalar tier"))])
@pytest.mark.parametrize("qtype", [T.TQ1_0, T.TQ2_0, T.Q8_0, T.Q4_1], ids=lambda t: t.name)
def test_tiles_over_long_rows_and_many_tokens_match_scalar(tier, qtype):
    """Rows of 33,280 columns make a ternary tile of about 270 KB (a Q8_0 row tile 283 KB, a
    Q4_1 one 166 KB), so a product goes in runs of one or a few tiles each against every group
    of 4 tokens (ops.c's tq_tiles_product, row_tiles_product), where the rows above fit in one
    run; 300 rows give each of one thread's chunks of rows 2 or 3 ternary tiles (19 row tiles)."""
    rng = np.random.default_rng(7)
    rows, cols = 300, 130 * 256
    raw = random_matrix(qtype, rows, cols, rng)
    x = rng.standard_normal((9, cols)).astype(np.float32)
    np.testing.assert_array_equal(product(tier, 1, qtype, raw, cols, x), product("scalar", 1, qtype, raw, cols, x))


def test_the_32_weight_types_on_int16_codes_are_multiplied_from_row_tiles_of_their_own_size():
    """The backend multiplies exactly these types from row tiles (cpu_kernels/row_tiles.c), and a
    tile row takes the file's bytes per block: the tiles of 11 rows are the blocks of 16 (two
    tiles of 8, the last padded), nothing widened. The kernels refuse every other type."""
    rng = np.random.default_rng(11)
    backend = CpuBackend(threads=1)
    assert cpu_backend._ROW_TILED_TYPES == frozenset(ROW_TILED_TYPES)
    for qtype in QUANT_TYPES + FLOAT_TYPES:
        cols = 256
        raw = random_matrix(qtype, 11, cols, rng)
        if qtype not in ROW_TILED_TYPES:  # nor does the product take such a type as row tiles
            out = np.empty((1, 11), dtype=np.float32)
            entry = (raw.reshape(-1), backend.native.ROW_TILES + int(qtype), 11, cols, out, None)
            with pytest.raises(ValueError, match="has no native kernel"):
                backend._emit("linear", _bufs(a=np.ones((1, cols), dtype=np.float32)), (entry,), tokens=1)
        if qtype in ROW_TILED_TYPES:
            kept = raw.copy()
            tiles = backend.native.tile(raw.reshape(-1), int(qtype), 11, cols, False)
            assert len(tiles) == raw.nbytes // 11 * 16, qtype.name
            np.testing.assert_array_equal(raw, kept)  # memory not of a file is paged out, never dropped
        elif qtype not in TABLE_TYPES:  # (those take tiles of 32 rows)
            with pytest.raises(ValueError, match="not taken in tiles"):
                backend.native.tile(raw.reshape(-1), int(qtype), 11, cols, False)


@pytest.mark.parametrize("qtype", [T.Q1_0, T.TQ1_0, T.TQ2_0, T.Q4_K, T.Q8_0], ids=lambda t: t.name)
def test_the_kernels_threads_make_the_same_tiles_and_count_the_same_bad_scales_as_one_thread(qtype):
    """Tiles are made, and scales checked, by the kernels' threads, each taking whole tiles (whole
    blocks): 3 threads (12 chunks for 3 or 10 tiles, some empty) make one thread's bytes, and count
    every damaged block once."""
    rng = np.random.default_rng(70 + int(qtype))
    rows, cols = 75, 512
    raw = random_matrix(qtype, rows, cols, rng).reshape(-1)
    size = GGML_QUANT_SIZES[qtype][1]
    damaged = raw.copy()
    bad = rng.choice(damaged.size // size, 7, replace=False)
    for block in bad:  # an fp16 inf in the block's scale d
        damaged[block * size + SCALE_OFFSETS[qtype][0] : block * size + SCALE_OFFSETS[qtype][0] + 2] = [0x00, 0x7C]
    made = {}
    for threads in (1, 3):
        native = CpuBackend(threads=threads).native
        made[threads] = native.tile(raw, int(qtype), rows, cols, False)
        assert native.count_bad_scales(damaged, int(qtype), damaged.size // size) == len(bad)
    assert made[1] == made[3]


@pytest.mark.parametrize("qtype", ROW_TILED_TYPES, ids=lambda t: t.name)
def test_embedding_rows_read_from_row_tiles_are_gguf_py_s(qtype):
    """A tied output head keeps only its row tiles in memory (the file's blocks leave the
    process), so embedding lookups put a row's blocks back together from the tiles: each of 19 rows (two
    whole tiles of 8 and a padded one), dequantized, is gguf-py's row bit for bit."""
    rng = np.random.default_rng(600 + int(qtype))
    rows, cols = 19, 768
    raw = random_matrix(qtype, rows, cols, rng)
    backend = CpuBackend(threads=1)
    matrix = CpuMatrix("token_embd.weight", raw.reshape(-1), int(qtype), rows, cols)
    expected = dequantize(raw.reshape(-1), int(qtype), (rows, cols))
    backend.prepare_output(matrix)
    assert matrix.tiles is not None
    matrix.raw[:] = 0  # the tiles alone serve the lookups
    ids = np.array([0, 7, 8, 18, 5, 18], dtype=np.int64)
    np.testing.assert_array_equal(np.asarray(backend.embedding(matrix, ids)), expected[ids])


def cpuinfo() -> dict[str, str]:
    """The first processor's fields as Linux lists them in /proc/cpuinfo (empty elsewhere)."""
    info = Path("/proc/cpuinfo")
    lines = info.read_text().split("\n\n", 1)[0].splitlines() if info.exists() else []
    return {key.strip(): value.strip() for key, value in (line.split(":", 1) for line in lines if ":" in line)}


def cpu_flags() -> set[str]:
    """The CPU's feature flags as Linux lists them (empty elsewhere)."""
    return set(cpuinfo().get("flags", "").split())


def test_the_ternary_tiles_take_the_vbmi_kernel_exactly_where_the_cpu_has_vbmi():
    """The comparison with scalar above checks whichever ternary kernel each tier picks: the
    AVX-512 tiers must pick the VBMI one (steps laid by row) on a CPU with AVX-512 VBMI, so
    that it is the one checked there, and every other tier its own."""
    for tier in TIERS:
        kernel = cpu_native.load(tier).TQ_KERNEL
        assert kernel == ("avx512vbmi" if tier.startswith("avx512") and "avx512vbmi" in cpu_flags() else tier)


def test_the_ymm_tier_goes_first_exactly_on_cores_that_split_512_bit_operations():
    """AMD's family 25 (Zen 4) runs a 512-bit operation as two 256-bit halves, and there the
    avx512_ymm tier's 256-bit decode products are the faster (docs/performance-notes.md); on every
    other CPU with AVX-512 the avx512 tier goes first. Both are built and checked wherever
    AVX-512 runs."""
    info = cpuinfo()
    halves = info.get("vendor_id") == "AuthenticAMD" and info.get("cpu family") == "25" and "avx512f" in cpu_flags()
    assert cpu_native.load("scalar").cpu_has("avx512_halves") == halves
    if "avx512" in TIERS:
        assert "avx512_ymm" in TIERS
        assert TIERS[0] == ("avx512_ymm" if halves else "avx512")
        assert TIERS.index("avx512_ymm") < TIERS.index("avx2")


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("qtype", QUANT_TYPES, ids=lambda t: t.name)
def test_products_are_within_the_activation_quantization_bound(qtype, threads):
    rng = np.random.default_rng(200 + int(qtype))
    rows, cols = 37, 512  # 37: a Q1_0 tile of 32 rows and a padded one
    raw = random_matrix(qtype, rows, cols, rng)
    weights = dequantize(raw.reshape(-1), int(qtype), (rows, cols)).astype(np.float64)
    for n_tokens in (1, 4, 16):
        x = rng.standard_normal((n_tokens, cols)).astype(np.float32)
        got = product(TIERS[0], threads, qtype, raw, cols, x)
        exact = x.astype(np.float64) @ weights.T
        # each x is off by at most half a step, amax / (2 code max), of its group of 32 (of 256 for
        # the types decoded in int16 per 256); then float32 sums
        span = 256 if qtype in INT16_DECODE_TYPES else 32
        step = np.abs(x).reshape(n_tokens, cols // span, span).max(-1) / (2.0 * CODE_MAX[qtype])  # (T, spans)
        magnitude = np.abs(x).astype(np.float64) @ np.abs(weights).T  # (T, rows)
        bound = (step @ np.abs(weights).reshape(rows, cols // span, span).sum(-1).T) * 1.001 + 1e-6 * magnitude
        assert np.all(np.abs(got - exact) <= bound), np.max(np.abs(got - exact) - bound)


@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("qtype", CODES8_TYPES + INT16_CODES_TYPES, ids=lambda t: t.name)
def test_products_over_32_tokens_or_more_take_integer_codes(qtype, threads):
    """A prefill multiplies integer weights with activation codes: 8-bit codes with a scale per
    group of 32 for the types on 8-bit codes (cpu_kernels/panels.h), int16 ones with a scale per
    block of 256 for Q4_K to Q6_K (row tiles; Q5_K: int16_panels.c) and per group of 32 for the
    32-weight types (row tiles). Within half a step, amax / (2 code max) of the group or block, per element, of the
    exact product, and no further than float32 rounding besides; a large element in each group
    widens every step of its span (the float form's bound would fail)."""
    rng = np.random.default_rng(400 + int(qtype))
    rows, cols, tokens = 9, 768, 37  # 9: tiles of 4 (8) rows and a remainder; 3 blocks of 256
    span = 256 if qtype in INT16_DECODE_TYPES else 32
    raw = random_matrix(qtype, rows, cols, rng)
    weights = dequantize(raw.reshape(-1), int(qtype), (rows, cols)).astype(np.float64)
    x = rng.standard_normal((tokens, cols)).astype(np.float32)
    x[:, ::32] *= 1000.0
    x[3, 256:512] *= 1e-3  # a block far smaller than the others: its own scale
    exact = x.astype(np.float64) @ weights.T
    magnitude = np.abs(x).astype(np.float64) @ np.abs(weights).T  # (T, rows)
    step = np.abs(x).reshape(tokens, cols // span, span).max(-1) / (2.0 * CODE_MAX[qtype])  # (tokens, spans)
    bound = step @ np.abs(weights).reshape(rows, cols // span, span).sum(-1).T * 1.001 + 1e-6 * magnitude
    got = product(TIERS[0], threads, qtype, raw, cols, x)
    assert np.all(np.abs(got - exact) <= bound), np.max(np.abs(got - exact) - bound)
    float_bound = 8e-6 * magnitude  # what float activations would meet: these codes do not
    assert np.any(np.abs(got - exact) > float_bound)


@pytest.mark.parametrize("tier", TIERS)
@pytest.mark.parametrize("qtype", CODES8_TYPES, ids=lambda t: t.name)
def test_types_on_8_bit_codes_multiply_the_activations_rounded_per_group(tier, qtype):
    """For any count of tokens (decode, a batch, a prefill of 40), the types on 8-bit codes
    multiply what 8-bit codes with a scale per group of 32 make of the activations (d = amax /
    127, x / d rounded to even, worked out here in NumPy) exactly, to float32 rounding: so their
    only error is that rounding. A scale per 256 would break the bound on almost every product here,
    where groups differ in magnitude by up to 2^12."""
    rng = np.random.default_rng(450 + int(qtype))
    rows, cols = 9, 768
    raw = random_matrix(qtype, rows, cols, rng)
    weights = dequantize(raw.reshape(-1), int(qtype), (rows, cols)).astype(np.float64)
    for count in (1, 3, 16, 40):
        x = rng.standard_normal((count, cols // 32, 32)) * 2.0 ** -rng.integers(0, 13, (count, cols // 32, 1))
        x = x.astype(np.float32)  # (count, groups, 32)
        d = np.abs(x).max(-1, keepdims=True) / np.float32(127.0)  # (count, groups, 1)
        rounded = (np.round(x / d) * d).reshape(count, cols).astype(np.float64)  # (count, cols)
        exact = rounded @ weights.T
        magnitude = np.abs(rounded) @ np.abs(weights).T
        got = product(tier, 2, qtype, raw, cols, x.reshape(count, cols))
        assert np.all(np.abs(got - exact) <= 8e-6 * magnitude), (count, np.max(np.abs(got - exact) / magnitude))


@pytest.mark.parametrize("tier", TIERS)
@pytest.mark.parametrize("qtype", SAME_CODES_TYPES, ids=lambda t: t.name)
def test_a_token_s_products_are_the_same_bits_alone_in_a_batch_and_in_a_prefill(tier, qtype):
    """The types on int16 codes take the same codes in decode as in prefill, from their row tiles
    (row_tiles.c: per 32, per 256 for Q4_K and Q6_K), and so does Q2_K its 8-bit ones (its
    rows as the file has them took byte panels in a prefill), so a token's logits do not depend on how
    many tokens it was multiplied with: alone, 2, 3, 5 or 40 at once (a prefill), on 33 rows
    (each thread's chunks of tiles and a padded one); 4 tokens on rows of 4096 columns, and 9
    and 40 on rows of 2048, whose codes (rows 4 KB apart) a pass over the tiles takes copied
    further apart (ops.c). So do Q4_K, Q5_K and Q6_K's rows as the file has them (Q5_K's dense
    matrices, a stack whose experts are not whole tiles; cpu_kernels/int16_panels.c: straight
    from the bytes for up to 4 tokens on the x86 tiers, through unpacked rows otherwise), whose
    codes of 4 tokens at 4096 columns (32 KB) AVX-512 takes two tokens a pass over 4 rows."""
    rng = np.random.default_rng(500 + int(qtype))
    rows = 33
    multiplies = (product, row_product) if qtype in INT16_DECODE_TYPES else (product,)
    for cols, counts in ((1024, (2, 3, 5, 40)), (4096, (4,)), (2048, (9, 40))):
        raw = random_matrix(qtype, rows, cols, rng)
        x = rng.standard_normal((max(counts), cols)).astype(np.float32)
        x[:, ::32] *= 30.0
        for multiply in multiplies:
            alone = np.stack([multiply(tier, 1, qtype, raw, cols, x[t:t + 1])[0] for t in range(max(counts))])
            for n in counts:
                np.testing.assert_array_equal(multiply(tier, 2, qtype, raw, cols, x[:n]), alone[:n],
                                              err_msg=f"{multiply.__name__} {cols=} T={n}")


@pytest.mark.parametrize("qtype", QUANT_TYPES, ids=lambda t: t.name)
def test_every_native_type_is_multiplied_in_place_from_the_mapped_file(qtype, tmp_path):
    """prepare_weight keeps a native type's blocks where the file's memory map has them (no
    copy, no conversion, no load note), and the products read them there."""
    rng = np.random.default_rng(400 + int(qtype))
    rows, cols = 6, 512
    blocks = random_matrix(qtype, rows, cols, rng)
    path = tmp_path / "blocks.bin"
    path.write_bytes(b"\0" * 64 + blocks.tobytes())  # at an offset, as a tensor in a GGUF file
    mapped = np.memmap(path, dtype=np.uint8, mode="r")
    backend = CpuBackend(threads=1)
    matrix = backend.prepare_weight(WeightSpec("blk.0.ffn_up.weight", mapped[64:], int(qtype), (rows, cols)))
    assert isinstance(matrix, CpuMatrix) and matrix.ggml_type == int(qtype)
    assert np.shares_memory(matrix.raw, mapped) and backend.load_notes == []
    assert cpu_backend._file_backed(matrix.raw) and not cpu_backend._file_backed(blocks)
    x = rng.standard_normal((2, cols)).astype(np.float32)
    np.testing.assert_array_equal(backend.linear(x, matrix), product(TIERS[0], 1, qtype, blocks, cols, x))
    # a tiled type's pages left the process (MADV_DONTNEED) and come back from the file when read
    np.testing.assert_array_equal(np.asarray(matrix.raw), blocks.reshape(-1))


@pytest.mark.parametrize("tier", TIERS)
@pytest.mark.parametrize("qtype", QUANT_TYPES, ids=lambda t: t.name)
def test_an_infinite_activation_makes_its_token_s_products_nan_and_leaves_the_others(tier, qtype):
    """A token whose row holds an inf (or a nan) cannot be quantized to codes (or to the table
    types' tables): its products are nan, never a finite number that looks right, and the
    tokens beside it keep theirs."""
    rng = np.random.default_rng(9)
    rows, cols = 37, 512  # 37: a tile of 32 rows and a padded one
    raw = random_matrix(qtype, rows, cols, rng)
    x = rng.standard_normal((3, cols)).astype(np.float32)
    clean = product(tier, 1, qtype, raw, cols, x)
    x[1, 300] = np.inf
    x[2, 7] = np.nan
    got = product(tier, 1, qtype, raw, cols, x)
    assert np.all(np.isnan(got[1:])), got[1:]
    np.testing.assert_array_equal(got[0], clean[0])


@pytest.mark.parametrize("qtype", FLOAT_TYPES, ids=lambda t: t.name)
def test_float_activations_are_not_quantized(qtype):
    rng = np.random.default_rng(5)
    rows, cols = 19, 300  # 300: no multiple of 8, the tail lanes
    raw = random_matrix(qtype, rows, cols, rng)
    weights = dequantize(raw.reshape(-1), int(qtype), (rows, cols)).astype(np.float64)
    x = rng.standard_normal((3, cols)).astype(np.float32)
    np.testing.assert_allclose(product(TIERS[0], 2, qtype, raw, cols, x), x @ weights.T, rtol=1e-5, atol=1e-4)


def test_the_iq_grid_header_is_gguf_py_s_tables():
    """backends/cpu_kernels/iq_grids.h is what tools/fixtures/make_iq_grids.py writes from gguf-py's
    tables today, and its grids are gguf-py's (ggml's) point for point."""
    assert HEADER.read_text() == render()
    quants.IQ2_XXS.init_grid()
    assert np.array_equal(grid_values(quants.IQ2_XXS)[1], [43, 8, 8, 8, 8, 8, 8, 8])  # ggml: 0x080808080808082b
    assert grid_values(quants.IQ1_S).shape == (2048, 8) and grid_values(quants.IQ3_S).shape == (512, 4)


def test_a_tier_can_be_forced_and_a_wrong_one_is_refused(monkeypatch):
    monkeypatch.setenv(cpu_native.TIER_ENV, "scalar")
    assert CpuBackend().native.TIER == "scalar"
    monkeypatch.setenv(cpu_native.TIER_ENV, "sse9")
    with pytest.raises(BackendUnavailable, match="unknown instruction-set tier 'sse9'"):
        CpuBackend()
    unrunnable = [t for t in cpu_native.TIERS if t not in TIERS]
    if unrunnable:
        monkeypatch.setenv(cpu_native.TIER_ENV, unrunnable[0])
        with pytest.raises(BackendUnavailable, match="cannot run here"):
            CpuBackend()


def test_thread_count_is_set_and_reported(monkeypatch):
    assert CpuBackend(threads=3).threads == 3
    monkeypatch.setenv(cpu_native.THREADS_ENV, "1")
    backend = CpuBackend()
    assert backend.threads == 1 and "1 threads" in backend.device_name


def test_rope_of_a_new_model_is_not_served_from_the_last_ones():
    """The kernel reuses the last position's cos/sin; a table with other values (a new
    model, whose table may sit at a freed one's address) must not get them."""
    x = np.random.default_rng(1).standard_normal((1, 2, 8)).astype(np.float32)
    positions = np.array([7])
    first = CpuBackend(threads=1)
    first.rope(x, positions, 10000.0, 8, True)
    first.close()
    ours = CpuBackend(threads=1).rope(x, positions, 1e6, 8, True)
    half = np.arange(4, dtype=np.float64)
    angles = 7 * 1e6 ** (-2 * half / 8)  # worked out by hand: theta_i = pos * base^(-2i/d)
    a, b = x[0, :, :4].astype(np.float64), x[0, :, 4:].astype(np.float64)
    expected = np.concatenate([a * np.cos(angles) - b * np.sin(angles), a * np.sin(angles) + b * np.cos(angles)], -1)
    np.testing.assert_allclose(ours[0], expected, rtol=1e-5, atol=1e-6)


def test_ops_take_their_slots_by_the_names_the_kernels_export():
    """The op table (OPS in ops.h) is the one list of op codes and slot names: the backend
    builds each op by keyword from the module's OPS, refuses a missing or unknown name, and
    the kernels refuse a tuple with another number of slots than the table names."""
    be = CpuBackend(threads=1)
    ops = be.native.OPS
    assert ops["rope"] == (4, ("tokens", "heads", "dim", "rope_dim", "neox", "per_row"), ("mscale",))
    assert ops["add"] == (7, ("elements",), ())
    assert ops["route"] == (9, ("tokens", "experts", "used", "order", "normalize"), ())
    assert ops["experts"] == (10, ("tokens", "experts", "used", "ffn", "activation"), ())
    assert ops["layer_norm"] == (11, ("rows", "dim"), ("eps",))
    assert ops["scale"] == (12, ("elements",), ("factor",))
    assert ops["columns"] == (13, ("rows", "cols", "start", "count"), ())
    assert ops["short_conv"] == (14, ("tokens", "channels", "kernel"), ())
    assert ops["delta_net"] == (15, ("tokens", "k_heads", "v_heads", "head_dim", "chunk"), ("eps",))
    assert ops["sigmoid_gate"] == (16, ("rows", "dim", "gate_dim"), ())
    assert len({code for code, _, _ in ops.values()}) == len(ops) == 16
    x = np.arange(8, dtype=np.float32)
    out = np.full(8, -1.0, dtype=np.float32)
    with pytest.raises(ValueError, match=r"missing \['elements'\], unknown \[\]"):
        be._emit("add", _bufs(a=x, b=x, out=out))
    with pytest.raises(ValueError, match=r"missing \[\], unknown \['scale'\]"):
        be._emit("add", _bufs(a=x, b=x, out=out), elements=8, scale=2.0)
    with pytest.raises(ValueError, match="no op 'mul'"):
        be._emit("mul", _bufs(a=x, b=x, out=out), elements=8)
    with pytest.raises(ValueError, match=r"op add takes ints \(elements\) and floats \(\)"):
        be.native.run((ops["add"][0], _bufs(a=x, b=x, out=out), (), (8, 1), ()))
    be._emit("add", _bufs(a=x, b=x, out=out), elements=3)  # the named slot is the count the kernel adds
    np.testing.assert_array_equal(out, [0, 2, 4, -1, -1, -1, -1, -1])
    # slots given in any order land in their own fields: the op-by-op rope's bits
    q = np.random.default_rng(1).standard_normal((3, 2, 8)).astype(np.float32)
    rotated = np.empty_like(q)
    table = 10000.0 ** (-np.arange(2, dtype=np.float64) * 2.0 / 4)
    be._emit("rope", _bufs(a=q, out=rotated, pos=np.array([5]), table=table),
             per_row=False, neox=True, rope_dim=4, dim=8, heads=2, tokens=3, mscale=1.0)
    np.testing.assert_array_equal(rotated, np.array(be.rope(q, np.arange(5, 8), 10000.0, 4, True)))
