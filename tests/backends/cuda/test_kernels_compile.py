"""Every CUDA kernel file compiles for real, with no GPU: NVRTC 12.9 for every architecture
users get a cubin for (and the PTX), nvcc 13 with warnings as errors; and no kernel spills,
overflows the register file at its `__launch_bounds__` block size, or declares more static
shared memory than a block may have. Purpose-broken sources prove that the checks fail.

The kernel files are found by globbing `backends/cuda/kernels/*.cu`, so a new file is
covered without editing this test; `compile_kernels/sample.cu` is always there too. Each
(file, compiler, target) compiles once per session.
"""

import functools
from collections.abc import Callable
from pathlib import Path

import pytest

from backends.cuda.compiler import (
    CUBIN_ARCHS,
    KERNELS_DIR,
    NVCC_ARCHS,
    Compiled,
    CompileError,
    KernelResources,
    block_registers,
    compile_nvcc,
    compile_nvrtc,
    find_nvcc,
    nvrtc,
    parse_ptxas_log,
    ptx_block_sizes,
)
from backends.cuda.modules import arch_capability
from backends.errors import BackendUnavailable

SAMPLES = Path(__file__).parent / "compile_kernels"
BROKEN = SAMPLES / "broken"
KERNEL_FILES = [*sorted(KERNELS_DIR.glob("*.cu")), SAMPLES / "sample.cu"]
COMPILERS: dict[str, Callable[[Path, str], Compiled]] = {"nvrtc": compile_nvrtc, "nvcc": compile_nvcc}
NEWEST = max(CUBIN_ARCHS, key=arch_capability)  # users get its PTX too


def _need(compiler: str) -> None:
    """Skip, saying why, when `compiler` ("nvrtc" or "nvcc") is not installed."""
    try:
        nvrtc() if compiler == "nvrtc" else find_nvcc()
    except BackendUnavailable as missing:
        where = "`make install` installs it" if compiler == "nvrtc" else "it comes with the CUDA toolkit"
        pytest.skip(f"{compiler} is not available ({missing}); {where}")


@functools.cache
def _compiled(compiler: str, source: Path, target: str) -> Compiled | CompileError:
    """One compilation per session: the result, or the error it raised."""
    try:
        return COMPILERS[compiler](source, target)
    except CompileError as error:
        return error


def _clean(compiler: str, source: Path, target: str) -> Compiled:
    """The compiled file, failing the test with the compiler's log or the problems found."""
    _need(compiler)
    result = _compiled(compiler, source, target)
    if isinstance(result, CompileError):
        pytest.fail(str(result), pytrace=False)
    if result.problems():
        pytest.fail("\n".join(result.problems()), pytrace=False)
    return result


@pytest.mark.parametrize("arch", CUBIN_ARCHS)
@pytest.mark.parametrize("source", KERNEL_FILES, ids=lambda p: p.name)
def test_nvrtc_cubin_is_clean(source, arch):
    compiled = _clean("nvrtc", source, arch)
    assert compiled.kernels, f"ptxas reported no kernel for {source.name}: {compiled.log}"
    assert compiled.image.startswith(b"\x7fELF")


@pytest.mark.parametrize("source", KERNEL_FILES, ids=lambda p: p.name)
def test_nvrtc_ptx_of_the_newest_arch(source):
    ptx = _clean("nvrtc", source, NEWEST).ptx
    assert f".target {NEWEST}" in ptx.decode(errors="replace")
    assert ptx.endswith(b"\0")  # cuModuleLoadData reads PTX up to its NUL


@pytest.mark.parametrize("arch", NVCC_ARCHS)
@pytest.mark.parametrize("source", KERNEL_FILES, ids=lambda p: p.name)
def test_nvcc_cubin_is_clean(source, arch):
    compiled = _clean("nvcc", source, arch)
    assert compiled.kernels, f"ptxas reported no kernel for {source.name}: {compiled.log}"


@pytest.mark.parametrize("compiler", ["nvrtc", "nvcc"])
def test_block_sizes_come_from_launch_bounds(compiler):
    compiled = _clean(compiler, SAMPLES / "sample.cu", "sm_90")
    # sample.cu: __launch_bounds__(SAMPLE_THREADS), a macro for 256 in sample.cuh; and (64, 4).
    assert {k.name: k.max_threads for k in compiled.kernels} == {"scale_shifted": 256, "fill": 64}
    shared = {k.name: k.shared for k in compiled.kernels}
    assert shared == {"scale_shifted": 256 * 4, "fill": 0}  # float tile[SAMPLE_THREADS]


def test_line_info_adds_line_tables_and_changes_no_resource():
    _need("nvrtc")
    plain = compile_nvrtc(SAMPLES / "sample.cu", "sm_86")
    lines = compile_nvrtc(SAMPLES / "sample.cu", "sm_86", line_info=True)
    assert lines.kernels == plain.kernels
    assert b".nv_debug_line_sass" in lines.image and b".nv_debug_line_sass" not in plain.image


# -- the checks themselves, on purpose-broken sources -------------------------------------


@pytest.mark.parametrize(("compiler", "arch"), [("nvrtc", "sm_61"), ("nvrtc", "sm_120"), ("nvcc", "sm_90")])
def test_a_syntax_error_is_reported(compiler, arch):
    _need(compiler)
    with pytest.raises(CompileError, match=r'syntax\.cu\(2\): error: expected a ";"'):
        COMPILERS[compiler](BROKEN / "syntax.cu", arch)


@pytest.mark.parametrize(("compiler", "arch"), [("nvrtc", "sm_61"), ("nvrtc", "sm_90"), ("nvcc", "sm_90")])
def test_a_spilling_kernel_is_reported(compiler, arch):
    _need(compiler)
    compiled = COMPILERS[compiler](BROKEN / "spills.cu", arch)
    (kernel,) = compiled.kernels
    assert kernel.spill_stores > 0 and kernel.spill_loads > 0
    assert kernel.max_threads == 1024
    assert any("spills: spills registers" in problem for problem in compiled.problems())


@pytest.mark.parametrize("compiler", ["nvrtc", "nvcc"])
def test_a_register_file_overflow_is_reported(compiler):
    _need(compiler)
    compiled = COMPILERS[compiler](BROKEN / "unbounded.cu", "sm_80")
    (kernel,) = compiled.kernels
    assert kernel.max_threads is None and kernel.registers > 64  # 64 × 1024 threads is the whole file
    assert any("more than the 65536 of the register file" in problem for problem in compiled.problems())


def test_a_warning_is_reported():
    _need("nvrtc")
    compiled = compile_nvrtc(BROKEN / "unused.cu", "sm_80")
    assert compiled.kernels[0].problems() == []
    (problem,) = compiled.problems()
    assert 'variable "never_read" was declared but never referenced' in problem


def test_nvcc_fails_on_a_warning():
    _need("nvcc")
    with pytest.raises(CompileError, match=r'error #177-D: variable "never_read"'):
        compile_nvcc(BROKEN / "unused.cu", "sm_80")


def test_too_much_static_shared_memory_is_reported():
    fits = KernelResources("k", registers=32, spill_stores=0, spill_loads=0, stack=0, shared=48 * 1024, max_threads=256)
    over = KernelResources(
        "k", registers=32, spill_stores=0, spill_loads=0, stack=0, shared=48 * 1024 + 4, max_threads=256
    )
    assert fits.problems() == []
    (problem,) = over.problems()
    assert "49156 bytes of static shared memory" in problem


# -- reading the compilers' output --------------------------------------------------------


def test_block_registers_round_each_warp_up_to_256():
    assert block_registers(64, 1024) == 65536  # 32 warps × 64 × 32
    assert block_registers(65, 1024) == 32 * 2304  # 65 × 32 = 2080 → 2304 per warp
    assert block_registers(1, 1) == 256  # one warp, one allocation unit
    assert block_registers(40, 96) == 3 * 1280


def test_ptxas_log_is_read_per_kernel():
    log = """\
ptxas info    : 0 bytes gmem
ptxas info    : Function properties for helper
ptxas         .     16 bytes stack frame, 8 bytes spill stores, 8 bytes spill loads
ptxas info    : Compiling entry function 'first' for 'sm_86'
ptxas info    : Function properties for first
ptxas         .     24 bytes stack frame, 4 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 40 registers, used 1 barriers, 24 bytes cumulative stack size, 4096 bytes smem, 380 bytes cmem[0]
ptxas info    : Compile time = 3.0 ms
ptxas info    : Compiling entry function 'second' for 'sm_86'
ptxas info    : Function properties for second
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 12 registers, used 0 barriers, 360 bytes cmem[0]
"""
    first, second = parse_ptxas_log(log, {"first": 128})
    assert first == KernelResources("first", 40, 4, 12, 24, 4096, 128)
    assert second == KernelResources("second", 12, 0, 0, 0, 0, None)


def test_ptx_block_sizes_multiply_the_dimensions():
    ptx = """\
.visible .entry tiles(
\t.param .u64 tiles_param_0
)
.maxntid 16, 8, 1
.minnctapersm 2
{
\tret;
}
.visible .entry exact(
\t.param .u64 exact_param_0
)
.reqntid 64
{
\tret;
}
.visible .entry free(
\t.param .u64 free_param_0
)
{
\tret;
}
"""
    assert ptx_block_sizes(ptx) == {"tiles": 128, "exact": 64, "free": None}
