"""The driver probe against stand-in driver libraries built here: what each machine's user reads.

Each stub is a small C file compiled with gcc into a `libcuda.so.1` whose driver functions
return the values a test chooses (a driver version, cuInit's result, the GPUs it reports),
loaded by pointing the probe at it.
"""

import shutil
import subprocess
from pathlib import Path

import pytest

from backends.cuda import probe as probe_module
from backends.cuda.probe import GpuInfo, probe, unavailable_reason

# The driver API's signatures and constants as cuda.h declares them (CUdevice is an int;
# 75 and 76 are CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR and _MINOR; 100 is CUDA_ERROR_NO_DEVICE).
STUB_SOURCE = r"""
#include <stddef.h>
#include <string.h>
int cuDriverGetVersion(int *version) { *version = VERSION; return 0; }
int cuInit(unsigned int flags) { return INIT_RESULT; }
int cuDeviceGetCount(int *count) { *count = DEVICES; return 0; }
int cuDeviceGet(int *device, int ordinal) { *device = ordinal; return 0; }
int cuDeviceGetName(char *name, int length, int device) { strncpy(name, "Stub GPU", length); return 0; }
int cuDeviceGetAttribute(int *value, int attribute, int device) {
    *value = attribute == 75 ? MAJOR : attribute == 76 ? MINOR : 0;
    return 0;
}
int cuDeviceTotalMem_v2(size_t *bytes, int device) { *bytes = (size_t)24 << 30; return 0; }
int cuGetErrorName(int error, const char **name) {
    *name = error == 100 ? "CUDA_ERROR_NO_DEVICE" : "CUDA_ERROR_UNKNOWN";
    return 0;
}
"""


@pytest.fixture
def stub_driver(tmp_path: Path):
    """Build a stub driver library: stub_driver(version=12090, init_result=0, devices=1, capability=(8, 6))."""
    if shutil.which("gcc") is None:
        pytest.skip("gcc is not installed: no stub driver library can be built")
    source = tmp_path / "libcuda_stub.c"
    source.write_text(STUB_SOURCE)
    built = 0

    def build(version=12090, init_result=0, devices=1, capability=(8, 6)) -> str:
        nonlocal built
        built += 1
        library = tmp_path / f"stub{built}" / "libcuda.so.1"
        library.parent.mkdir()
        defines = {"VERSION": version, "INIT_RESULT": init_result, "DEVICES": devices, "MAJOR": capability[0],
                   "MINOR": capability[1]}  # fmt: skip
        subprocess.run(
            ["gcc", "-shared", "-fPIC", "-o", str(library), str(source)] + [f"-D{k}={v}" for k, v in defines.items()],
            check=True,
        )
        return str(library)

    return build


@pytest.fixture
def with_packages(monkeypatch: pytest.MonkeyPatch):
    """Make the probe see pycuda and cuda-bindings as installed, or not: with_packages(pycuda=False)."""

    def pretend(pycuda: bool = True, bindings: bool = True) -> None:
        installed = {"pycuda": pycuda, "cuda.bindings": bindings}
        monkeypatch.setattr(probe_module, "_installed", lambda package: installed[package])

    return pretend


def test_no_driver_library_names_it():
    found = probe("/nonexistent/libcuda.so.1")
    assert found.driver_version is None and found.devices == ()
    assert unavailable_reason(found) == "cuda: no NVIDIA driver (/nonexistent/libcuda.so.1 not found)"


def test_this_machine_without_a_driver(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("SPRIG_LIBCUDA", raising=False)
    found = probe()
    if found.driver_version is not None:
        pytest.skip("this machine has an NVIDIA driver")
    assert unavailable_reason(found) == "cuda: no NVIDIA driver (libcuda.so.1 not found)"


def test_one_gpu_is_described(stub_driver, with_packages):
    with_packages()
    found = probe(stub_driver(version=12090, devices=1, capability=(8, 6)))
    assert found.driver_version == 12090
    assert found.devices == (GpuInfo("Stub GPU", (8, 6), 24 * 2**30),)
    assert found.devices[0].description == "Stub GPU (compute capability 8.6, 24.0 GiB)"
    assert unavailable_reason(found) is None


def test_no_gpu(stub_driver, with_packages):
    with_packages()
    # The driver loads and starts, and counts no GPU; or cuInit itself says CUDA_ERROR_NO_DEVICE.
    assert unavailable_reason(probe(stub_driver(devices=0))) == "cuda: the driver found no GPU"
    assert unavailable_reason(probe(stub_driver(init_result=100, devices=1))) == "cuda: the driver found no GPU"


def test_old_driver(stub_driver, with_packages):
    with_packages()
    found = probe(stub_driver(version=11040))  # a 470 driver: CUDA 11.4
    assert unavailable_reason(found) == (
        "cuda: the NVIDIA driver (CUDA 11.4) is too old for Sprig's kernels (needs CUDA 12.0 or newer: "
        "driver 525.60.13 on Linux, 527.41 on Windows); update the NVIDIA driver"
    )


def test_driver_that_does_not_start(stub_driver, with_packages):
    with_packages()
    found = probe(stub_driver(init_result=999))
    assert unavailable_reason(found) == "cuda: the NVIDIA driver did not start (cuInit: CUDA_ERROR_UNKNOWN (999))"


def test_gpu_older_than_the_cubins(stub_driver, with_packages):
    with_packages()
    found = probe(stub_driver(capability=(5, 2)))  # Maxwell; the oldest cubin is sm_61
    assert unavailable_reason(found) == (
        "cuda: the Stub GPU (compute capability 5.2) is older than Sprig's kernels support (6.1 or newer)"
    )


def test_missing_python_packages(stub_driver, with_packages):
    library = stub_driver()
    with_packages(pycuda=False)
    assert unavailable_reason(probe(library)) == "cuda: pycuda is not installed (pip install 'sprig[cuda]')"
    with_packages(bindings=False)
    assert unavailable_reason(probe(library)) == "cuda: cuda-bindings is not installed (pip install 'sprig[cuda]')"


def test_library_from_the_environment(stub_driver, with_packages, monkeypatch: pytest.MonkeyPatch):
    with_packages()
    library = stub_driver(version=13000, devices=2)
    monkeypatch.setenv("SPRIG_LIBCUDA", library)
    found = probe()
    assert found.library == library and found.driver_version == 13000 and len(found.devices) == 2
