"""The CUDA backend's activations: float32 tensors over pooled device buffers.

A `DeviceTensor` is a shape over a buffer of device memory, reshaped and sliced by rows
without copying. Buffers come from a `BufferPool` of power-of-two sizes and go back to it
when their last tensor is dropped: the stream runs launches in order, so a buffer handed
out again is written only after the kernels that read it before. While a graph records,
the pool keeps every buffer it hands out for the graph (`holding`).
"""

import numpy as np

from backends.cuda.device import Device

F32 = 4  # bytes


class BufferPool:
    """Device buffers of power-of-two sizes, reused as tensors come and go."""

    def __init__(self, device: Device):
        self.device = device
        self._free: dict[int, list[int]] = {}
        self._all: list[int] = []
        self.holding: list[Buffer] | None = None  # while a graph records: every buffer taken, kept for it

    def take(self, nbytes: int) -> tuple[int, int]:
        """A buffer of at least `nbytes`: (pointer, its size class)."""
        size = max(256, 1 << (max(nbytes, 1) - 1).bit_length())
        spare = self._free.get(size)
        if spare:
            return spare.pop(), size
        ptr = self.device.alloc(size)
        self._all.append(ptr)
        return ptr, size

    def give(self, ptr: int, size: int) -> None:
        """Return a buffer from `take`."""
        self._free.setdefault(size, []).append(ptr)

    def close(self) -> None:
        """Free every buffer the pool made."""
        for ptr in self._all:
            self.device.free(ptr)
        self._all.clear()
        self._free.clear()


class Buffer:
    """One pooled buffer, returned to its pool when the last tensor over it goes."""

    __slots__ = ("pool", "ptr", "size")

    def __init__(self, pool: BufferPool, nbytes: int):
        self.pool = pool
        self.ptr, self.size = pool.take(nbytes)
        if pool.holding is not None:  # a recorded graph writes it at every replay: never handed out again
            pool.holding.append(self)

    def __del__(self) -> None:
        self.pool.give(self.ptr, self.size)


class DeviceTensor:
    """A contiguous float32 array on the device: `shape` elements from `offset` (floats) on in
    `buffer`. Reshapes and row slices are views."""

    __slots__ = ("buffer", "offset", "shape")

    def __init__(self, buffer: Buffer, shape: tuple[int, ...], offset: int = 0):
        self.buffer, self.shape, self.offset = buffer, tuple(int(n) for n in shape), offset

    @property
    def ptr(self) -> int:
        """The device address of the first element."""
        return self.buffer.ptr + F32 * self.offset

    @property
    def size(self) -> int:
        """The number of elements."""
        return int(np.prod(self.shape))

    @property
    def ndim(self) -> int:
        """The number of axes."""
        return len(self.shape)

    def __len__(self) -> int:
        return self.shape[0]

    def reshape(self, *shape: int) -> "DeviceTensor":
        """The same elements with another shape (one axis may be -1), as NumPy's reshape of a contiguous array."""
        if len(shape) == 1 and isinstance(shape[0], tuple):
            shape = shape[0]
        dims = list(shape)
        if -1 in dims:
            known = int(np.prod([d for d in dims if d != -1]))
            dims[dims.index(-1)] = self.size // known
        if int(np.prod(dims)) != self.size:
            raise ValueError(f"cannot reshape {self.shape} to {tuple(shape)}")
        return DeviceTensor(self.buffer, tuple(dims), self.offset)

    def __getitem__(self, index: slice) -> "DeviceTensor":
        """Rows `index` (a slice with step 1 of the first axis), as a view."""
        if not isinstance(index, slice) or index.step not in (None, 1):
            raise TypeError(f"a device tensor takes slices of rows only, not {index!r}")
        lo, hi, _ = index.indices(self.shape[0])
        row = int(np.prod(self.shape[1:]))
        return DeviceTensor(self.buffer, (max(hi - lo, 0), *self.shape[1:]), self.offset + lo * row)


class DeviceToken:
    """A token id left on the device by `argmax` (int32), for the next step to read there."""

    __slots__ = ("buffer",)

    def __init__(self, buffer: Buffer):
        self.buffer = buffer

    @property
    def ptr(self) -> int:
        """The device address of the int32 token."""
        return self.buffer.ptr
