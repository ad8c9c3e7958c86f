"""The device interface the CUDA backend is written against: allocate, copy, launch,
synchronize, and record a sequence of launches as a graph to replay.

Two implementations: `pycuda_device.PyCudaDevice` on an NVIDIA GPU, and
`emulator_device.EmulatorDevice`, which runs the same `.cu` kernels on the CPU.

Device memory is addressed by plain integers (device pointers). Kernel arguments are NumPy
scalars in the order the kernel declares them: `np.uintp` for pointers, `np.int32`,
`np.uint32`, `np.int64` or `np.float32` for values. Kernels live in modules named by their
file stem under `backends/cuda/kernels/` (`"products"` is `products.cu`).
"""

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

import numpy as np

Dim3 = tuple[int, int, int]
KernelArg = np.generic


class Graph(ABC):
    """A recorded sequence of launches, replayed with the values their arguments pointed to
    at replay time (so a step reads its token and position from device memory)."""

    @abstractmethod
    def replay(self) -> None:
        """Launch the recorded kernels again, in order, on the device's stream."""


class Device(ABC):
    """One compute device: memory, kernel modules and one stream that runs launches in order."""

    name: str = "abstract"

    @property
    @abstractmethod
    def description(self) -> str:
        """What the device is, in words for the user (the GPU's name and memory, or the emulator)."""

    @abstractmethod
    def alloc(self, nbytes: int) -> int:
        """A new buffer of `nbytes` (at least 256-byte aligned), as a device pointer."""

    @abstractmethod
    def free(self, ptr: int) -> None:
        """Release a buffer from `alloc`."""

    @abstractmethod
    def upload(self, ptr: int, host: np.ndarray) -> None:
        """Copy the contiguous host array `host` to device memory at `ptr`."""

    @abstractmethod
    def download(self, host: np.ndarray, ptr: int) -> None:
        """Fill the contiguous host array `host` from device memory at `ptr` (waits for the stream)."""

    @abstractmethod
    def copy(self, dst: int, src: int, nbytes: int) -> None:
        """Device-to-device copy, in stream order."""

    @abstractmethod
    def memset(self, ptr: int, value: int, nbytes: int) -> None:
        """Set `nbytes` bytes at `ptr` to the byte `value`, in stream order."""

    @abstractmethod
    def function(self, module: str, name: str) -> Any:
        """The kernel `name` (declared `extern "C" __global__`) of kernel file `module`."""

    @abstractmethod
    def launch(self, function: Any, grid: Dim3, block: Dim3, args: Sequence[KernelArg]) -> None:
        """Queue `function` over `grid` blocks of `block` threads on the stream."""

    @abstractmethod
    def synchronize(self) -> None:
        """Wait until every queued launch and copy has finished."""

    @abstractmethod
    def begin_capture(self) -> None:
        """Start recording launches (and device-side copies) instead of running them."""

    @abstractmethod
    def end_capture(self) -> Graph:
        """Stop recording and return what was recorded, ready to replay."""

    def close(self) -> None:  # noqa: B027  # a no-op unless the device holds a context
        """Release the device's context and modules. Idempotent."""

    # -- conveniences over the primitives ------------------------------------------------

    def to_device(self, host: np.ndarray) -> int:
        """A new buffer holding a copy of `host`."""
        host = np.ascontiguousarray(host)
        ptr = self.alloc(max(host.nbytes, 1))
        self.upload(ptr, host)
        return ptr

    def from_device(self, ptr: int, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        """A host copy of `shape` elements of `dtype` at `ptr`."""
        host = np.empty(shape, dtype=dtype)
        self.download(host, ptr)
        return host
