"""What `backends.cuda.device.Device` promises, checked on the emulator and on a GPU alike:
copies, memset, launches in stream order, recorded graphs that replay with the values in
device memory at replay time, and driver errors as BackendErrors.

The kernel is the test's own (`device_kernels/contract.cu`). On a GPU it is compiled for the
GPU's architecture by nvcc where the machine has it (the GPU session), else by NVRTC.
"""

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from backends.cuda.compiler import compile_nvcc, compile_nvrtc
from backends.cuda.device import Device
from backends.errors import BackendError, BackendUnavailable
from tests.backends.cuda.devices import chosen_devices, device_or_skip

KERNELS = Path(__file__).parent / "device_kernels"
N = 1000  # elements: four blocks of 256 threads, the last one partly idle
GRID, BLOCK = (4, 1, 1), (256, 1, 1)
RNG = np.random.default_rng(11)


def compiled_for_gpu(module: str, capability: tuple[int, int], driver_version: int) -> tuple[bytes, str]:
    """The test's kernel file `module` compiled for the GPU (PyCudaDevice's `images`)."""
    source, target = KERNELS / f"{module}.cu", f"sm_{capability[0]}{capability[1]}"
    try:
        return compile_nvcc(source, target).image, f"{source.name} by nvcc for {target}"
    except BackendUnavailable:
        return compile_nvrtc(source, target).image, f"{source.name} by NVRTC for {target}"


@pytest.fixture(scope="module", params=chosen_devices())
def dev(request: pytest.FixtureRequest) -> Iterator[Device]:
    """A device of each kind that loads the test's kernels."""
    if request.param == "emulator":
        opened = device_or_skip("emulator", kernel_dirs=(KERNELS,))
    else:
        opened = device_or_skip("gpu", images=compiled_for_gpu)
    yield opened
    opened.close()


def _scaled_add(dev: Device, y: int, x: int, factor: int) -> None:
    args = (np.uintp(y), np.uintp(x), np.uintp(factor), np.int32(N))
    dev.launch(dev.function("contract", "scaled_add"), GRID, BLOCK, args)


def test_copies_and_memset(dev: Device):
    data = RNG.integers(0, 256, size=4096, dtype=np.uint8)
    first = dev.to_device(data)
    second = dev.alloc(data.nbytes)
    assert first % 256 == 0 and second % 256 == 0
    dev.copy(second, first, data.nbytes)
    dev.memset(second + 100, 0xAB, 1000)
    want = data.copy()
    want[100:1100] = 0xAB
    np.testing.assert_array_equal(dev.from_device(first, data.shape, np.uint8), data)
    np.testing.assert_array_equal(dev.from_device(second, data.shape, np.uint8), want)
    dev.free(first)
    dev.free(second)


def test_launches_run_in_stream_order(dev: Device):
    x, y = RNG.standard_normal(N).astype(np.float32), RNG.standard_normal(N).astype(np.float32)
    xp, yp, factor = dev.to_device(x), dev.to_device(y), dev.to_device(np.array([2], dtype=np.int32))
    _scaled_add(dev, yp, xp, factor)
    dev.upload(factor, np.array([-5], dtype=np.int32))  # queued after the first launch
    _scaled_add(dev, yp, xp, factor)
    dev.synchronize()
    np.testing.assert_array_equal(dev.from_device(yp, (N,), np.float32), (y + 2 * x) - 5 * x)


def test_graph_replays_with_values_written_after_recording(dev: Device):
    x = RNG.standard_normal(N).astype(np.float32)
    xp, factor = dev.to_device(x), dev.to_device(np.array([3], dtype=np.int32))
    work, out = dev.alloc(4 * N), dev.to_device(np.full(N, 7.0, dtype=np.float32))
    dev.begin_capture()
    dev.memset(work, 0, 4 * N)
    _scaled_add(dev, work, xp, factor)
    dev.copy(out, work, 4 * N)
    graph = dev.end_capture()
    np.testing.assert_array_equal(dev.from_device(out, (N,), np.float32), np.full(N, 7.0, np.float32))  # not run
    graph.replay()
    np.testing.assert_array_equal(dev.from_device(out, (N,), np.float32), 3 * x)
    dev.upload(factor, np.array([-4], dtype=np.int32))
    graph.replay()
    np.testing.assert_array_equal(dev.from_device(out, (N,), np.float32), -4 * x)


def test_a_missing_kernel_is_a_backend_error(dev: Device):
    with pytest.raises(BackendError):
        dev.function("contract", "no_such_kernel")


def test_gpu_errors_say_what_was_being_done():
    if "gpu" not in chosen_devices():
        pytest.skip(f"SPRIG_CUDA_DEVICE chose {chosen_devices()[0]}")
    gpu = device_or_skip("gpu", images=compiled_for_gpu)
    args = (np.uintp(0), np.uintp(0), np.uintp(0), np.int32(0))
    with pytest.raises(BackendError, match="launching a kernel"):
        gpu.launch(gpu.function("contract", "scaled_add"), (1, 1, 1), (2048, 1, 1), args)  # over 1024 threads
    gpu.close()
    gpu.close()  # idempotent
