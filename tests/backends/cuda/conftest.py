"""The CUDA backend's tests run on two devices: the CPU emulator of the kernels, and a GPU.

A test that takes the `device` fixture runs once on each ("emulator", "gpu"). Where no GPU
can run (no driver, no GPU, no PyCUDA: `backends.cuda.probe` says which), the GPU's run
skips with that sentence; with `SPRIG_CUDA_DEVICE=gpu` (the GPU session) it fails instead
(`tests/backends/cuda/devices.py`).
"""

from collections.abc import Iterator

import pytest

from backends.cuda.device import Device
from tests.backends.cuda.devices import chosen_devices, device_or_skip


@pytest.fixture(scope="session", params=chosen_devices())
def device(request: pytest.FixtureRequest) -> Iterator[Device]:
    """The emulator, then the GPU (one session each), running the backend's own kernels."""
    opened = device_or_skip(request.param)
    yield opened
    opened.close()
