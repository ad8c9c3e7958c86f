"""The CUDA emulator: correct kernels give NumPy's exact results in every lane order, and broken
ones (the bugs a GPU punishes with hangs or garbage) are reported as KernelFault with a clear message.

The kernels are the test's own, in `emulator_kernels/`. References are worked out with NumPy.
"""

import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from backends.cuda.emulator import build
from backends.cuda.emulator.build import asan_runtime, kernel_names
from backends.cuda.emulator_device import ORDERS, EmulatorDevice, KernelFault
from backends.errors import BackendError

KERNELS = Path(__file__).parent / "emulator_kernels"
FULL_WARP = 32

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="the CUDA emulator needs g++")


@pytest.fixture(scope="module", params=list(ORDERS))
def dev(request: pytest.FixtureRequest) -> EmulatorDevice:
    """The emulator running each block's threads in one of its lane orders."""
    return EmulatorDevice(order=request.param, seed=3, kernel_dirs=(KERNELS,))


@pytest.fixture(scope="module")
def forward() -> EmulatorDevice:
    """The emulator in forward lane order."""
    return EmulatorDevice(order="forward", kernel_dirs=(KERNELS,))


def ptr(p: int) -> np.uintp:
    return np.uintp(p)


def run(dev: EmulatorDevice, module: str, name: str, grid: int, block: int, *args: np.generic) -> None:
    dev.launch(dev.function(module, name), (grid, 1, 1), (block, 1, 1), args)


def test_block_sum_with_shared_memory_and_barriers(dev: EmulatorDevice):
    x = np.random.default_rng(1).integers(-1000, 1000, size=4 * 256, dtype=np.int32)
    px, out = dev.to_device(x), dev.alloc(4 * 4)
    run(dev, "correct", "block_sum", 4, 256, ptr(px), ptr(out))
    np.testing.assert_array_equal(dev.from_device(out, (4,), np.int32), x.reshape(4, 256).sum(axis=1))  # (block, t)


def test_warp_sum_by_xor_shuffles(dev: EmulatorDevice):
    x = np.random.default_rng(2).integers(-1000, 1000, size=3 * 128, dtype=np.int32)
    px, out = dev.to_device(x), dev.alloc(12 * 4)
    run(dev, "correct", "warp_sum", 3, 128, ptr(px), ptr(out))
    np.testing.assert_array_equal(dev.from_device(out, (12,), np.int32), x.reshape(12, 32).sum(axis=1))  # (warp, lane)


def test_shuffles_within_segments_of_16(dev: EmulatorDevice):
    n = 2 * 64
    x = np.random.default_rng(3).integers(-(2**31), 2**31 - 1, size=n, dtype=np.int32)
    px = dev.to_device(x)
    outs = [dev.alloc(4 * n) for _ in range(4)]
    run(dev, "correct", "shuffles_width16", 2, 64, ptr(px), *map(ptr, outs))
    down, up, idx, xr = (dev.from_device(o, (n,), np.int32) for o in outs)
    i = np.arange(n)
    within = i % 16  # the lane's place in its segment of 16
    segment = i - within
    np.testing.assert_array_equal(down, x[np.where(within + 3 < 16, i + 3, i)])  # past the segment: own value
    np.testing.assert_array_equal(up, x[np.where(within >= 3, i - 3, i)])
    np.testing.assert_array_equal(idx, x[segment + 21 % 16])
    # xor 9 stays within each segment of 16 (9 < 16).
    np.testing.assert_array_equal(xr, x[segment + (within ^ 9)])


def test_votes(dev: EmulatorDevice):
    x = np.random.default_rng(4).integers(-5, 5, size=4 * 32, dtype=np.int32)
    x[32:64] = 1  # a warp where all lanes agree
    x[64:96] = -1  # and one where none does
    px = dev.to_device(x)
    ballot, any_, all_ = dev.alloc(16), dev.alloc(16), dev.alloc(16)
    run(dev, "correct", "votes", 2, 64, ptr(px), ptr(ballot), ptr(any_), ptr(all_))
    positive = (x > 0).reshape(4, 32)  # (warp, lane)
    want = (positive * (1 << np.arange(32, dtype=np.uint64))).sum(axis=1).astype(np.uint32)
    np.testing.assert_array_equal(dev.from_device(ballot, (4,), np.uint32), want)
    np.testing.assert_array_equal(dev.from_device(any_, (4,), np.int32), positive.any(axis=1))
    np.testing.assert_array_equal(dev.from_device(all_, (4,), np.int32), positive.all(axis=1))


def test_atomics_from_many_blocks(dev: EmulatorDevice):
    n = 40 * 128 - 7
    x = np.random.default_rng(5).integers(-(2**11), 2**11, size=n, dtype=np.int32)
    px = dev.to_device(x)
    total, max_min, bits, fsum, wide = (
        dev.to_device(np.zeros(k, dtype=t))
        for k, t in [(1, np.int32), (3, np.int32), (1, np.uint32), (1, np.float32), (1, np.uint64)]
    )
    dev.upload(max_min, np.array([-(2**31), 2**31 - 1, 0], dtype=np.int32))
    run(dev, "correct", "atomics", 40, 128, ptr(px), np.int32(n), *map(ptr, (total, max_min, bits, fsum, wide)))
    assert dev.from_device(total, (1,), np.int32)[0] == x.sum()
    got_max, got_min, first = dev.from_device(max_min, (3,), np.int32)
    assert (got_max, got_min) == (x.max(), x.min())
    assert 1 <= first <= n
    assert dev.from_device(bits, (1,), np.uint32)[0] == np.bitwise_or.reduce(np.uint32(1) << (x & 31).astype(np.uint32))
    assert dev.from_device(fsum, (1,), np.float32)[0] == x.sum()  # partial sums below 2^24: exact in any order
    assert dev.from_device(wide, (1,), np.uint64)[0] == (x.astype(np.uint32).astype(np.uint64) << 20).sum()


def test_dp4a_signed_and_unsigned(dev: EmulatorDevice):
    n = 1000
    rng = np.random.default_rng(6)
    a, b, c = (rng.integers(-(2**31), 2**31 - 1, size=n, dtype=np.int32) for _ in range(3))
    c //= 4  # room for the products' sum
    outs = dev.alloc(4 * n), dev.alloc(4 * n)
    run(dev, "correct", "dp4a", 4, 256, *map(ptr, map(dev.to_device, (a, b, c))), *map(ptr, outs), np.int32(n))
    bytes_a, bytes_b = a.view(np.int8).reshape(n, 4), b.view(np.int8).reshape(n, 4)  # (n, byte)
    want_signed = (bytes_a.astype(np.int64) * bytes_b).sum(axis=1) + c
    want_unsigned = (bytes_a.view(np.uint8).astype(np.int64) * bytes_b.view(np.uint8)).sum(axis=1) + c.view(np.uint32)
    np.testing.assert_array_equal(dev.from_device(outs[0], (n,), np.int32), want_signed.astype(np.int32))
    np.testing.assert_array_equal(dev.from_device(outs[1], (n,), np.uint32), (want_unsigned % 2**32).astype(np.uint32))


def _edge_floats() -> np.ndarray:
    """Floats where conversions to half go wrong: around the largest half, the smallest
    subnormals and their ties, zeros, infinities."""
    tiny = 2.0**-24  # the smallest half subnormal
    values = [
        0.0,
        -0.0,
        1.0,
        -1.0,
        65504.0,
        65519.99,
        65520.0,
        -65520.0,
        1e9,
        np.inf,
        -np.inf,
        tiny,
        tiny / 2,
        tiny * 0.50001,
        tiny * 1.5,
        tiny * 2.5,
        tiny * 3.5,
        2.0**-14,
        2.0**-14 * (1 - 2**-11),
        1e-40,
        -1e-45,
        1 + 2**-11,
        1 + 3 * 2**-11,
        3.4e38,
    ]
    return np.array(values, dtype=np.float32)


def _bfloat16_value(bits: np.ndarray) -> np.ndarray:
    """The value of bfloat16 bit patterns (no NaNs), in float64, from sign, exponent and mantissa; the
    pattern past the largest finite value counts as 2^128 (where rounding to infinity is decided)."""
    sign = np.where(bits >> 15, -1.0, 1.0)
    exponent, mantissa = ((bits >> 7) & 0xFF).astype(np.int64), (bits & 0x7F).astype(np.float64)
    normal = (1 + mantissa / 128) * np.exp2(exponent - 127.0)
    return sign * np.where(exponent > 0, normal, mantissa / 128 * 2.0**-126)


def _bfloat16_reference(x: np.ndarray) -> np.ndarray:
    """bfloat16 bits of float32 x (no NaNs) rounded to nearest even: of the two bfloat16 values around x
    (its bits truncated, and the next one away from zero), the nearer."""
    low = x.view(np.uint32) >> 16
    high = np.where((low & 0x7FFF) == 0x7F80, low, low + 1)  # infinity has no next value
    exact = x.astype(np.float64)
    d_low, d_high = np.abs(exact - _bfloat16_value(low)), np.abs(_bfloat16_value(high) - exact)
    pick_high = (d_high < d_low) | ((d_high == d_low) & (low % 2 == 1))
    return np.where(pick_high, high, low).astype(np.uint16)


def test_half_and_bfloat16_conversions_and_arithmetic(dev: EmulatorDevice):
    rng = np.random.default_rng(7)
    # Halves: every bit pattern, then normal values in [-4, 4] (where a * b + c is exact in float64).
    moderate_halves = rng.uniform(-4, 4, size=3000).astype(np.float16).view(np.uint16)
    h = np.concatenate([np.arange(2**16, dtype=np.uint16), moderate_halves])
    n = h.size
    edges = _edge_floats()
    random_bits = rng.integers(0, 2**32, size=n - edges.size - 3000, dtype=np.uint64).astype(np.uint32)
    x = np.concatenate([edges, random_bits.view(np.float32), rng.normal(0, 3, size=3000).astype(np.float32)])
    out16 = [dev.alloc(2 * n) for _ in range(5)]
    out32 = [dev.alloc(4 * n) for _ in range(2)]
    run(
        dev,
        "correct",
        "halves",
        (n + 255) // 256,
        256,
        ptr(dev.to_device(x)),
        ptr(dev.to_device(h)),
        np.int32(n),
        ptr(out16[0]),
        ptr(out32[0]),
        ptr(out16[1]),
        ptr(out32[1]),
        *map(ptr, out16[2:]),
    )
    to_half, to_bf16, hmul, hadd, hfma = (dev.from_device(o, (n,), np.uint16) for o in out16)
    from_half, from_bf16 = (dev.from_device(o, (n,), np.float32) for o in out32)

    nan = np.isnan(x)
    with np.errstate(over="ignore"):
        want_half = x.astype(np.float16)
    np.testing.assert_array_equal(to_half[~nan], want_half[~nan].view(np.uint16))
    assert np.isnan(to_half.view(np.float16)[nan]).all()
    np.testing.assert_array_equal(to_bf16[~nan], _bfloat16_reference(x[~nan]))
    assert ((to_bf16[nan] & 0x7FFF) > 0x7F80).all()

    halves = h.view(np.float16)
    half_nan = np.isnan(halves)
    want_from_half = halves[~half_nan].astype(np.float32).view(np.uint32)
    np.testing.assert_array_equal(from_half[~half_nan].view(np.uint32), want_from_half)
    assert np.isnan(from_half[half_nan]).all()
    np.testing.assert_array_equal(from_bf16.view(np.uint32), h.astype(np.uint32) << 16)

    a, b, c = halves, np.roll(halves, -1), np.roll(halves, -2)
    with np.errstate(all="ignore"):
        want_mul, want_add = (a * b), (a + b)  # NumPy: in float32, rounded once to half
        want_fma = (a.astype(np.float64) * b + c).astype(np.float32).astype(np.float16)
    checks = ((hmul, want_mul, slice(None)), (hadd, want_add, slice(None)), (hfma, want_fma, slice(-3000, -2)))
    for got, want, where in checks:
        g, w = got[where].view(np.float16), want[where]
        undefined = np.isnan(w)
        np.testing.assert_array_equal(g[~undefined].view(np.uint16), w[~undefined].view(np.uint16))
        assert np.isnan(g[undefined]).all()


def test_q8_0_matvec_one_warp_per_row(dev: EmulatorDevice):
    rows, cols = 50, 512
    rng = np.random.default_rng(8)
    d = rng.uniform(0.001, 0.01, size=(rows, cols // 32)).astype(np.float16)
    q = rng.integers(-127, 128, size=(rows, cols // 32, 32), dtype=np.int8)
    blocks = np.concatenate([d.view(np.uint8).reshape(rows, cols // 32, 2), q.view(np.uint8)], axis=2)  # (r, b, 34)
    x = rng.normal(size=cols).astype(np.float32)
    y = dev.alloc(4 * rows)
    run(
        dev,
        "correct",
        "matvec_q8_0",
        (rows + 7) // 8,
        256,
        ptr(dev.to_device(blocks)),
        ptr(dev.to_device(x)),
        np.int32(rows),
        np.int32(cols),
        ptr(y),
    )
    want = (d.astype(np.float64)[:, :, None] * q * x.reshape(cols // 32, 32)).sum(axis=(1, 2))  # (r, b, 32) summed
    np.testing.assert_allclose(dev.from_device(y, (rows,), np.float32), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("kernel", "threads", "message"),
    [
        (
            "shuffle_after_return",
            32,
            r"kernel shuffle_after_return, block \(0,0,0\): threads 16-31 wait at __shfl_xor_sync with mask 0xffffffff "
            r"\(.*broken\.cu:\d+\) but lanes 0-15 of warp 0 exited",
        ),
        (
            "barrier_in_branch",
            64,
            r"kernel barrier_in_branch, block \(0,0,0\): deadlock: the threads wait at different __syncthreads: "
            r"threads 0-15 wait at __syncthreads \(.*broken\.cu:\d+\); threads 16-63 wait at __syncthreads",
        ),
        (
            "exit_at_barrier",
            64,
            r"kernel exit_at_barrier, block \(0,0,0\): a thread exited while others wait at __syncthreads: "
            r"threads 0-4, 6-63 wait at __syncthreads \(.*\); thread 5 exited",
        ),
        (
            "mask_without_caller",
            32,
            r"kernel mask_without_caller, block \(0,0,0\): thread (1[6-9]|2\d|3[01]): "
            r"__shfl_sync with mask 0x0000ffff, which does not contain the calling lane",
        ),
    ],
)
def test_broken_kernels_fault_with_a_clear_message(dev: EmulatorDevice, kernel: str, threads: int, message: str):
    out = dev.to_device(np.zeros(threads, dtype=np.float32))
    args = (
        (ptr(out),)
        if kernel != "shuffle_after_return"
        else (ptr(dev.to_device(np.ones(threads, np.float32))), ptr(out))
    )
    with pytest.raises(KernelFault, match=message):
        run(dev, "broken", kernel, 1, threads, *args)


def test_a_failed_assert_faults_the_kernel_instead_of_aborting(forward: EmulatorDevice):
    x = np.arange(64, dtype=np.int32)
    x[40] = -1
    with pytest.raises(KernelFault, match=r"thread 40: assertion `x\[threadIdx.x\] >= 0` failed in .*broken\.cu:\d+"):
        run(forward, "broken", "assert_positive", 1, 64, ptr(forward.to_device(x)))


def test_a_fault_leaves_the_device_usable(forward: EmulatorDevice):
    out = forward.to_device(np.zeros(64, dtype=np.int32))
    with pytest.raises(KernelFault):
        run(forward, "broken", "barrier_in_branch", 1, 64, ptr(out))
    x = np.arange(256, dtype=np.int32)
    total = forward.alloc(4)
    run(forward, "correct", "block_sum", 1, 256, ptr(forward.to_device(x)), ptr(total))
    assert forward.from_device(total, (1,), np.int32)[0] == x.sum()
    # The same kernel file faults the same way again, and the fixed kernel beside it still runs.
    with pytest.raises(KernelFault, match="deadlock"):
        run(forward, "broken", "barrier_in_branch", 1, 64, ptr(out))
    rotated = forward.alloc(x.nbytes)
    run(forward, "broken", "rotate_fixed", 1, 256, ptr(forward.to_device(x)), ptr(rotated))
    np.testing.assert_array_equal(forward.from_device(rotated, x.shape, np.int32), np.roll(x, -1))


def _rotate(order: str, kernel: str) -> np.ndarray:
    dev = EmulatorDevice(order=order, kernel_dirs=(KERNELS,))
    x = np.arange(100, 356, dtype=np.int32)
    out = dev.alloc(x.nbytes)
    run(dev, "broken", kernel, 1, 256, ptr(dev.to_device(x)), ptr(out))
    return dev.from_device(out, x.shape, np.int32)


def test_a_missing_syncthreads_changes_the_result_with_the_lane_order():
    fixed = {order: _rotate(order, "rotate_fixed") for order in ORDERS}
    for result in fixed.values():
        np.testing.assert_array_equal(result, np.roll(np.arange(100, 356, dtype=np.int32), -1))
    assert not np.array_equal(_rotate("forward", "rotate_missing_sync"), _rotate("reverse", "rotate_missing_sync"))


def test_capture_records_launches_and_copies_and_replays_with_current_memory(forward: EmulatorDevice):
    n = 300
    value, out, spare = forward.to_device(np.array([5], dtype=np.int32)), forward.alloc(4 * n), forward.alloc(4 * n)
    forward.memset(out, 0, 4 * n)
    forward.begin_capture()
    forward.memset(spare, 0, 4 * n)
    run(forward, "correct", "add_from_memory", 2, 256, ptr(value), ptr(out), np.int32(n))
    forward.copy(spare, out, 4 * n)
    with pytest.raises(BackendError, match="recorded"):
        forward.upload(value, np.array([1], dtype=np.int32))
    graph = forward.end_capture()
    np.testing.assert_array_equal(forward.from_device(out, (n,), np.int32), 0)  # recorded, not run
    forward.upload(value, np.array([7], dtype=np.int32))
    graph.replay()
    graph.replay()
    np.testing.assert_array_equal(forward.from_device(out, (n,), np.int32), 14)
    np.testing.assert_array_equal(forward.from_device(spare, (n,), np.int32), 14)


def test_launch_checks_its_arguments(forward: EmulatorDevice):
    kernel = forward.function("correct", "add_from_memory")
    buf = forward.alloc(16)
    with pytest.raises(BackendError, match="takes 3 arguments, given 2"):
        forward.launch(kernel, (1, 1, 1), (32, 1, 1), (ptr(buf), ptr(buf)))
    with pytest.raises(BackendError, match="argument 2 is int64"):
        forward.launch(kernel, (1, 1, 1), (32, 1, 1), (ptr(buf), ptr(buf), np.int64(4)))
    with pytest.raises(BackendError, match="more than 1024 threads"):
        forward.launch(kernel, (1, 1, 1), (64, 32, 1), (ptr(buf), ptr(buf), np.int32(4)))
    with pytest.raises(BackendError, match="grid"):
        forward.launch(kernel, (0, 1, 1), (32, 1, 1), (ptr(buf), ptr(buf), np.int32(4)))
    with pytest.raises(BackendError, match="declares no kernel"):
        forward.function("correct", "no_such_kernel")
    with pytest.raises(BackendError, match="outside every buffer"):
        forward.upload(buf + 8, np.zeros(4, dtype=np.int32))


def test_kernel_names_follow_the_one_declaration_form():
    source = textwrap.dedent("""
        // extern "C" __global__ void commented_out(int x)
        extern "C" __global__ void plain(const float* x) {}
        extern "C" __global__ void __launch_bounds__(256)
            bounded(int n) {}
        __global__ void not_extern_c(int n) {}
    """)
    assert kernel_names(source) == ["plain", "bounded"]


def test_dynamic_shared_memory_is_refused_with_a_clear_message(tmp_path: Path):
    (tmp_path / "dynamic.cu").write_text(
        'extern "C" __global__ void k(float* x) {\n    extern __shared__ float s[];\n}\n'
    )
    dev = EmulatorDevice(kernel_dirs=(tmp_path,))
    with pytest.raises(
        BackendError, match=r"dynamic\.cu:2: `extern __shared__` \(dynamic shared memory\) is not supported"
    ):
        dev.function("dynamic", "k")


_ASAN_SCRIPT = """
import numpy as np
from backends.cuda.emulator_device import EmulatorDevice
dev = EmulatorDevice(asan=True, kernel_dirs=[{kernels!r}])
n = 100
x, out = dev.to_device(np.ones(n, dtype=np.float32)), dev.alloc(4 * n)
kernel = dev.function("out_of_bounds", "read_past_end")
dev.launch(kernel, (1, 1, 1), (128, 1, 1), (np.uintp(x), np.int32(n), np.uintp(out)))
print("no report")
"""


def test_asan_build_reports_an_out_of_bounds_read_with_the_cu_line():
    runtime = asan_runtime()
    if not runtime.is_absolute() or not runtime.exists():
        pytest.skip(f"no AddressSanitizer runtime for the compiler (g++ -print-file-name=libasan.so gave {runtime})")
    source = (KERNELS / "out_of_bounds.cu").read_text().splitlines()
    line = next(i for i, text in enumerate(source, 1) if "OUT OF BOUNDS" in text)
    env = dict(os.environ, LD_PRELOAD=str(runtime), ASAN_OPTIONS="detect_leaks=0")
    root = Path(__file__).resolve().parents[3]
    result = subprocess.run(
        [sys.executable, "-c", _ASAN_SCRIPT.format(kernels=str(KERNELS))],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert "no report" not in result.stdout, result.stderr[-3000:]
    assert "heap-buffer-overflow" in result.stderr, result.stderr[-3000:]
    assert re.search(rf"in read_past_end .*out_of_bounds\.cu:{line}\b", result.stderr), result.stderr[-3000:]
    assert "cuda emulator: in kernel read_past_end, block (0,0,0), thread (99,0,0)" in result.stderr


def _switch_variants() -> list:
    arm = ("aarch64-linux-gnu-g++", "qemu-aarch64")
    missing_arm = not all(shutil.which(tool) for tool in arm)
    return [
        pytest.param(["g++", "-DEMU_USE_UCONTEXT"], [], id="ucontext"),
        pytest.param(
            ["aarch64-linux-gnu-g++", "-static"],
            ["qemu-aarch64"],
            id="aarch64",
            marks=pytest.mark.skipif(missing_arm, reason="needs Debian's g++-aarch64-linux-gnu and qemu-user"),
        ),
    ]


@pytest.mark.parametrize(("compile_with", "run_with"), _switch_variants())
def test_other_context_switches_run_the_kernels(tmp_path: Path, compile_with: list[str], run_with: list[str]):
    emulator = Path(build.__file__).parent
    program = tmp_path / "driver"
    command = [*compile_with, *build.FLAGS, "-include", str(emulator / "cuda_emu.h"), "-I", str(emulator / "include")]
    command += [str(KERNELS / "switch_driver.cpp"), str(emulator / "fibers.cpp"), "-o", str(program), "-pthread"]
    subprocess.run(command, check=True, capture_output=True, timeout=600)
    result = subprocess.run([*run_with, str(program)], capture_output=True, text=True, timeout=600, check=True)
    x = np.arange(1024)
    block_sums = " ".join(str(s) for s in x.reshape(4, 256).sum(axis=1))  # (block, thread)
    warp_sums = x.reshape(32, 32).sum(axis=1)  # (warp, lane)
    want = (
        f"block_sum 0: {block_sums}\n"
        f"warp_sum 0: {warp_sums[0]} {warp_sums[31]}\n"
        "barrier_in_branch 1: kernel barrier_in_branch, block (0,0,0):\n"
    )
    assert result.stdout == want * 3


def test_description_names_the_thread_count(forward: EmulatorDevice):
    assert re.fullmatch(r"CUDA emulator on the CPU \(\d+ threads\)", forward.description)
