"""Whether a CUDA GPU can be used here, found out without importing PyCUDA.

`import pycuda.driver` fails without the NVIDIA driver, and a failed `pycuda.driver.init()`
says little, so the driver library is asked first, through ctypes: `cuInit(0)`, the CUDA
version it supports (`cuDriverGetVersion`: 12090 is CUDA 12.9), and each GPU's name,
compute capability and memory. `unavailable_reason` turns what was found into the one
sentence a user sees when the CUDA backend cannot start.

`SPRIG_LIBCUDA` names another driver library to load (a path), as the tests do with stubs.
"""

import ctypes
import importlib.util
import os
import sys
from dataclasses import dataclass

from backends.cuda.compiler import CUBIN_ARCHS
from backends.cuda.modules import arch_capability

# Cubins built by a CUDA 12 compiler load on any driver of CUDA 12.0 or newer (CUDA's minor
# version compatibility); older drivers cannot load them.
MIN_DRIVER_VERSION = 12000
MIN_DRIVER_RELEASE = "525.60.13 on Linux, 527.41 on Windows"
MIN_CAPABILITY = arch_capability(CUBIN_ARCHS[0])  # the oldest architecture Sprig builds cubins for

_CUDA_SUCCESS = 0
_CUDA_ERROR_NO_DEVICE = 100
_ATTRIBUTE_CAPABILITY_MAJOR = 75  # CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR
_ATTRIBUTE_CAPABILITY_MINOR = 76
_NAME_BYTES = 256


@dataclass(frozen=True)
class GpuInfo:
    """One GPU as the driver describes it."""

    name: str
    capability: tuple[int, int]
    memory: int  # bytes

    @property
    def description(self) -> str:
        """'NVIDIA H200 (compute capability 9.0, 140.4 GiB)'."""
        major, minor = self.capability
        return f"{self.name} (compute capability {major}.{minor}, {self.memory / 2**30:.1f} GiB)"


@dataclass(frozen=True)
class CudaProbe:
    """What the driver library said. `driver_version` is None when the library did not load;
    `init_result` is cuInit's result (0: success; else `devices` is empty and `init_error`
    names the error)."""

    library: str
    driver_version: int | None
    devices: tuple[GpuInfo, ...]
    pycuda_installed: bool
    bindings_installed: bool  # cuda-python's `cuda.bindings`, which records CUDA graphs
    init_result: int = _CUDA_SUCCESS
    init_error: str = ""


def default_library() -> str:
    """The driver library's name on this system, or `SPRIG_LIBCUDA` where it is set."""
    return os.environ.get("SPRIG_LIBCUDA") or ("nvcuda.dll" if sys.platform == "win32" else "libcuda.so.1")


def cuda_version(driver_version: int) -> str:
    """cuDriverGetVersion's number as a CUDA version: 12090 -> "12.9"."""
    return f"{driver_version // 1000}.{driver_version % 1000 // 10}"


def probe(library: str | None = None) -> CudaProbe:
    """Ask the driver library `library` (default: `default_library()`) what it can run."""
    library = library or default_library()
    packages = (_installed("pycuda"), _installed("cuda.bindings"))
    try:
        driver = ctypes.CDLL(library)
    except OSError:
        return CudaProbe(library, None, (), *packages)
    version = ctypes.c_int(0)
    driver.cuDriverGetVersion(ctypes.byref(version))
    result = driver.cuInit(0)
    if result != _CUDA_SUCCESS:
        return CudaProbe(library, version.value, (), *packages, result, _error_name(driver, result))
    count = ctypes.c_int(0)
    if driver.cuDeviceGetCount(ctypes.byref(count)) != _CUDA_SUCCESS:
        count.value = 0
    devices = tuple(_gpu_info(driver, ordinal) for ordinal in range(count.value))
    return CudaProbe(library, version.value, devices, *packages)


def _installed(package: str) -> bool:
    """Whether `package` can be imported (found without importing it; a missing parent is no error)."""
    try:
        return importlib.util.find_spec(package) is not None
    except ModuleNotFoundError:
        return False


def _gpu_info(driver: ctypes.CDLL, ordinal: int) -> GpuInfo:
    device = ctypes.c_int(0)
    driver.cuDeviceGet(ctypes.byref(device), ordinal)
    name = ctypes.create_string_buffer(_NAME_BYTES)
    driver.cuDeviceGetName(name, _NAME_BYTES, device)
    major, minor = ctypes.c_int(0), ctypes.c_int(0)
    driver.cuDeviceGetAttribute(ctypes.byref(major), _ATTRIBUTE_CAPABILITY_MAJOR, device)
    driver.cuDeviceGetAttribute(ctypes.byref(minor), _ATTRIBUTE_CAPABILITY_MINOR, device)
    memory = ctypes.c_size_t(0)
    driver.cuDeviceTotalMem_v2(ctypes.byref(memory), device)  # cuda.h's cuDeviceTotalMem
    return GpuInfo(name.value.decode(errors="replace"), (major.value, minor.value), memory.value)


def _error_name(driver: ctypes.CDLL, result: int) -> str:
    """'CUDA_ERROR_NO_DEVICE (100)', from the driver's own names where it has them."""
    name = ctypes.c_char_p()
    if driver.cuGetErrorName(result, ctypes.byref(name)) == _CUDA_SUCCESS and name.value:
        return f"{name.value.decode()} ({result})"
    return f"error {result}"


def unavailable_reason(found: CudaProbe) -> str | None:
    """Why the CUDA backend cannot run with what `found` says, in one sentence; None if it can."""
    if found.driver_version is None:
        return f"cuda: no NVIDIA driver ({found.library} not found)"
    if found.driver_version < MIN_DRIVER_VERSION:
        return (
            f"cuda: the NVIDIA driver (CUDA {cuda_version(found.driver_version)}) is too old for Sprig's kernels "
            f"(needs CUDA {cuda_version(MIN_DRIVER_VERSION)} or newer: driver {MIN_DRIVER_RELEASE}); "
            "update the NVIDIA driver"
        )
    if found.init_result not in (_CUDA_SUCCESS, _CUDA_ERROR_NO_DEVICE):
        return f"cuda: the NVIDIA driver did not start (cuInit: {found.init_error})"
    if not found.devices:
        return "cuda: the driver found no GPU"
    gpu = found.devices[0]
    if gpu.capability < MIN_CAPABILITY:
        return (
            f"cuda: the {gpu.name} (compute capability {gpu.capability[0]}.{gpu.capability[1]}) is older than "
            f"Sprig's kernels support ({MIN_CAPABILITY[0]}.{MIN_CAPABILITY[1]} or newer)"
        )
    if not found.pycuda_installed:
        return "cuda: pycuda is not installed (pip install 'sprig[cuda]')"
    if not found.bindings_installed:
        return "cuda: cuda-bindings is not installed (pip install 'sprig[cuda]')"
    return None
