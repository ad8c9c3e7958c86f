"""Opening a device for the CUDA backend's tests: the CPU emulator of the kernels, or a GPU.

`SPRIG_CUDA_DEVICE` narrows the devices the tests run on to one: the GPU session sets
`SPRIG_CUDA_DEVICE=gpu`, and then a GPU that does not start fails the tests instead of
skipping them, so that a session cannot pass without having run anything.
"""

import os

import pytest

from backends.cuda.device import Device
from backends.errors import BackendUnavailable

DEVICES = ("emulator", "gpu")


def chosen_devices() -> tuple[str, ...]:
    """The devices the tests run on: `SPRIG_CUDA_DEVICE`'s one where it names one, else both."""
    chosen = os.environ.get("SPRIG_CUDA_DEVICE")
    return (chosen,) if chosen in DEVICES else DEVICES


def open_device(kind: str, **options) -> Device:
    """A new device of `kind` ("emulator" or "gpu"), given `options` (EmulatorDevice's
    `kernel_dirs`, PyCudaDevice's `images`). Raises BackendUnavailable saying why it cannot
    run here."""
    if kind == "emulator":
        from backends.cuda.emulator_device import EmulatorDevice

        return EmulatorDevice(**options)
    from backends.cuda.probe import probe, unavailable_reason

    reason = unavailable_reason(probe())
    if reason is not None:
        raise BackendUnavailable(reason)
    from backends.cuda.pycuda_device import PyCudaDevice

    return PyCudaDevice(**options)


def device_or_skip(kind: str, **options) -> Device:
    """`open_device`, skipping the test with the reason where the device cannot run here,
    unless `SPRIG_CUDA_DEVICE` asked for that device: then the test fails."""
    try:
        return open_device(kind, **options)
    except BackendUnavailable as exc:
        if os.environ.get("SPRIG_CUDA_DEVICE") == kind:
            pytest.fail(f"SPRIG_CUDA_DEVICE={kind}, and it cannot run: {exc}")
        pytest.skip(str(exc))
