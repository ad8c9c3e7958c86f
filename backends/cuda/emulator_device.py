"""The CUDA device interface on the CPU: the backend's `.cu` kernels built by the host C++ compiler
(`emulator/build.py`) and run with each CUDA thread a fiber (`emulator/fibers.cpp`).

Device pointers are host addresses from `posix_memalign`, so an AddressSanitizer build
(`asan=True`, in a process started with `LD_PRELOAD` of `emulator.build.asan_runtime()`) sees
overruns. Launches run at once, on a small pool of OS threads; a fault inside a kernel (a
deadlock, a shuffle reading an exited lane, ...) abandons the launch and raises `KernelFault`.
"""

import bisect
import ctypes
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from backends.cuda.device import Device, Dim3, Graph, KernelArg
from backends.cuda.emulator.build import asan_runtime, build_module, kernel_names
from backends.errors import BackendError, BackendUnavailable

KERNELS_DIR = Path(__file__).resolve().parent / "kernels"
ORDERS = {"forward": 0, "reverse": 1, "shuffled": 2}  # lane order per scheduling round: fibers.cpp's Order
ALIGNMENT = 256
_MAX_BLOCK = (1024, 1024, 64)
_MAX_GRID = (2**31 - 1, 65535, 65535)


class KernelFault(BackendError):
    """A kernel did something a GPU would punish (a deadlock, a warp op naming an exited lane, ...);
    the message names the kernel, the block, the threads and what happened."""


def emulator_threads() -> int:
    """How many OS threads run blocks: `SPRIG_CUDA_EMULATOR_THREADS`, else one per core (as fibers.cpp counts)."""
    configured = os.environ.get("SPRIG_CUDA_EMULATOR_THREADS", "")
    if configured.isdigit() and int(configured) > 0:
        return int(configured)
    return os.cpu_count() or 1


@dataclass(frozen=True)
class EmulatorKernel:
    """A kernel of a built module: its launch thunk, and its parameters as (kind, bytes)."""

    module: str
    name: str
    thunk: Any  # ctypes function: int(unsigned x6, void**, int, unsigned long long)
    params: tuple[tuple[str, int], ...]
    library: ctypes.CDLL


class EmulatorGraph(Graph):
    """Recorded launches and device-side copies, run again in order."""

    def __init__(self, steps: list[Callable[[], None]]):
        self._steps = steps

    def replay(self) -> None:
        """Run every recorded step again, reading device memory as it is now."""
        for step in self._steps:
            step()


def _asan_loaded() -> bool:
    with open("/proc/self/maps") as maps:
        return "libasan" in maps.read()


def _check_arg(kernel: EmulatorKernel, index: int, arg: KernelArg, param: tuple[str, int]) -> np.ndarray:
    """`arg` as a 0-d array of the parameter's size and kind, or BackendError saying what does not fit."""
    kind, size = param
    value = np.asarray(arg)
    fits = value.ndim == 0 and value.dtype.itemsize == size
    if kind == "p":
        fits = fits and value.dtype.kind in "ui"
    elif kind == "f":
        fits = fits and value.dtype.kind == "f"
    elif kind in "iu":
        fits = fits and value.dtype.kind in "ui"
    if not fits:
        raise BackendError(
            f"kernel {kernel.name}: argument {index} is {value.dtype}{list(value.shape) or ''}, but the parameter "
            f"is {'a pointer' if kind == 'p' else {'f': 'a float', 'i': 'an int', 'u': 'an unsigned'}.get(kind, 'a')} "
            f"of {size} bytes"
        )
    return value


class EmulatorDevice(Device):
    """The CUDA device interface, run on the CPU by the emulator."""

    name = "emulator"

    def __init__(
        self,
        order: str | None = None,
        seed: int = 0,
        asan: bool = False,
        kernel_dirs: Sequence[Path] = (KERNELS_DIR,),
    ):
        order = order or os.environ.get("SPRIG_CUDA_EMULATOR_ORDER", "forward")
        if order not in ORDERS:
            raise BackendError(f"cuda emulator: unknown lane order {order!r} (one of {', '.join(ORDERS)})")
        if asan and not _asan_loaded():
            raise BackendUnavailable(
                "cuda emulator: an AddressSanitizer build loads only into a process started with "
                f"LD_PRELOAD={asan_runtime()} (and ASAN_OPTIONS=detect_leaks=0)"
            )
        self.order = order
        self.seed = seed
        self.asan = asan
        self.kernel_dirs = tuple(Path(d) for d in kernel_dirs)
        self._libc = ctypes.CDLL(None)
        self._libc.posix_memalign.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t, ctypes.c_size_t]
        self._libc.free.argtypes = [ctypes.c_void_p]
        self._modules: dict[str, ctypes.CDLL] = {}
        self._bases: list[int] = []  # sorted addresses of live buffers
        self._sizes: dict[int, int] = {}
        self._capture: list[Callable[[], None]] | None = None

    @property
    def description(self) -> str:
        """What runs the kernels."""
        return f"CUDA emulator on the CPU ({emulator_threads()} threads)"

    # -- memory ------------------------------------------------------------------------------

    def alloc(self, nbytes: int) -> int:
        """A new 256-byte aligned buffer of exactly `nbytes` (so AddressSanitizer catches overruns)."""
        ptr = ctypes.c_void_p()
        if self._libc.posix_memalign(ctypes.byref(ptr), ALIGNMENT, max(nbytes, 1)) != 0 or not ptr.value:
            raise BackendError(f"cuda emulator: cannot allocate {nbytes} bytes")
        bisect.insort(self._bases, ptr.value)
        self._sizes[ptr.value] = nbytes
        return ptr.value

    def free(self, ptr: int) -> None:
        """Release a buffer from `alloc`."""
        if ptr not in self._sizes:
            raise BackendError(f"cuda emulator: free of {ptr:#x}, which is not a live buffer")
        del self._sizes[ptr]
        self._bases.remove(ptr)
        self._libc.free(ptr)

    def _check_range(self, ptr: int, nbytes: int, what: str) -> None:
        """BackendError unless [ptr, ptr + nbytes) lies inside one live buffer."""
        i = bisect.bisect_right(self._bases, ptr) - 1
        if i < 0 or ptr + nbytes > self._bases[i] + self._sizes[self._bases[i]]:
            raise BackendError(f"cuda emulator: {what} of {nbytes} bytes at {ptr:#x} runs outside every buffer")

    def _refuse_in_capture(self, what: str) -> None:
        if self._capture is not None:
            raise BackendError(f"cuda emulator: {what} while a graph is being recorded (a GPU cannot capture it)")

    def upload(self, ptr: int, host: np.ndarray) -> None:
        """Copy the contiguous array `host` to `ptr`."""
        self._refuse_in_capture("a copy from the host")
        if not host.flags.c_contiguous:
            raise BackendError("cuda emulator: upload needs a contiguous array")
        self._check_range(ptr, host.nbytes, "upload")
        ctypes.memmove(ptr, host.ctypes.data, host.nbytes)

    def download(self, host: np.ndarray, ptr: int) -> None:
        """Fill the contiguous, writable array `host` from `ptr`."""
        self._refuse_in_capture("a copy to the host")
        if not (host.flags.c_contiguous and host.flags.writeable):
            raise BackendError("cuda emulator: download needs a contiguous, writable array")
        self._check_range(ptr, host.nbytes, "download")
        ctypes.memmove(host.ctypes.data, ptr, host.nbytes)

    def copy(self, dst: int, src: int, nbytes: int) -> None:
        """Device-to-device copy (recorded while capturing)."""
        self._check_range(src, nbytes, "copy from")
        self._check_range(dst, nbytes, "copy to")
        self._enqueue(lambda: ctypes.memmove(dst, src, nbytes))

    def memset(self, ptr: int, value: int, nbytes: int) -> None:
        """Set `nbytes` bytes at `ptr` to `value` (recorded while capturing)."""
        self._check_range(ptr, nbytes, "memset")
        self._enqueue(lambda: ctypes.memset(ptr, value, nbytes))

    def _enqueue(self, step: Callable[[], Any]) -> None:
        if self._capture is not None:
            self._capture.append(step)
        else:
            step()

    # -- kernels -----------------------------------------------------------------------------

    def _module(self, module: str) -> ctypes.CDLL:
        if module not in self._modules:
            found = [d / f"{module}.cu" for d in self.kernel_dirs if (d / f"{module}.cu").is_file()]
            if not found:
                raise BackendError(
                    f"cuda emulator: no kernel file {module}.cu in {', '.join(map(str, self.kernel_dirs))}"
                )
            library = ctypes.CDLL(str(build_module(found[0], asan=self.asan)))
            library.emu_last_fault.restype = ctypes.c_char_p
            self._modules[module] = library
        return self._modules[module]

    def function(self, module: str, name: str) -> EmulatorKernel:
        """The kernel `name` of kernel file `module`, built on first use."""
        library = self._module(module)
        try:
            thunk = getattr(library, f"emu_launch_{name}")
            describe = getattr(library, f"emu_params_{name}")
        except AttributeError:
            source = next(d / f"{module}.cu" for d in self.kernel_dirs if (d / f"{module}.cu").is_file())
            declared = ", ".join(kernel_names(source.read_text())) or "none"
            raise BackendError(
                f'cuda emulator: {module}.cu declares no kernel `extern "C" __global__ void {name}(...)` '
                f"(its kernels: {declared})"
            ) from None
        thunk.restype = ctypes.c_int
        thunk.argtypes = [*[ctypes.c_uint] * 6, ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, ctypes.c_ulonglong]
        describe.restype = ctypes.c_char_p
        text = describe().decode()
        params = tuple((p[0], int(p[1:])) for p in text.split(",")) if text else ()
        return EmulatorKernel(module, name, thunk, params, library)

    def launch(self, function: Any, grid: Dim3, block: Dim3, args: Sequence[KernelArg]) -> None:
        """Run `function` over `grid` blocks of `block` threads (recorded while capturing)."""
        kernel: EmulatorKernel = function
        for dims, limits, what in ((grid, _MAX_GRID, "grid"), (block, _MAX_BLOCK, "block")):
            if len(dims) != 3 or any(not 0 < d <= m for d, m in zip(dims, limits, strict=True)):
                raise BackendError(f"kernel {kernel.name}: {what} {tuple(dims)} is outside 1..{limits}")
        if block[0] * block[1] * block[2] > 1024:
            raise BackendError(f"kernel {kernel.name}: a block of {block} has more than 1024 threads")
        if len(args) != len(kernel.params):
            raise BackendError(f"kernel {kernel.name} takes {len(kernel.params)} arguments, given {len(args)}")
        values = [_check_arg(kernel, i, a, p) for i, (a, p) in enumerate(zip(args, kernel.params, strict=True))]
        pointers = (ctypes.c_void_p * max(len(values), 1))(*[v.ctypes.data for v in values])
        order, seed = ORDERS[self.order], self.seed
        held = (values, pointers)  # the argument values the pointers point to, alive as long as the step

        def run() -> None:
            if kernel.thunk(*grid, *block, held[1], order, seed) != 0:
                raise KernelFault(kernel.library.emu_last_fault().decode())

        self._enqueue(run)

    def synchronize(self) -> None:
        """Nothing to wait for: launches and copies run when queued."""

    # -- graphs ------------------------------------------------------------------------------

    def begin_capture(self) -> None:
        """Record launches, copies and memsets from now on instead of running them."""
        if self._capture is not None:
            raise BackendError("cuda emulator: a graph is already being recorded")
        self._capture = []

    def end_capture(self) -> Graph:
        """Stop recording; the recorded steps as a graph."""
        if self._capture is None:
            raise BackendError("cuda emulator: end_capture without begin_capture")
        steps, self._capture = self._capture, None
        return EmulatorGraph(steps)
