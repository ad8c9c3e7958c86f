"""The CPU emulator of the CUDA kernels, for tests: skipped, with the reason, where it is not built."""

import pytest

from backends.cuda.device import Device

ORDERS = ("forward", "reverse", "shuffled")  # the orders the emulator can run a block's threads in


def emulator(order: str = "forward") -> Device:
    """An `EmulatorDevice` running each block's threads in `order` (one of ORDERS)."""
    module = pytest.importorskip("backends.cuda.emulator_device", reason="the CUDA emulator is not built here")
    return module.EmulatorDevice(order=order)
