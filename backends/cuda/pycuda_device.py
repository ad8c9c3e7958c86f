"""The device interface on an NVIDIA GPU, through PyCUDA (and cuda-python for graphs).

One context, the device's primary context, made current around every call (PyCUDA's
contexts belong to a thread, and the app calls from its worker thread); one stream that
every copy and launch is queued on. Kernel images come from `modules.kernel_image` (the
prebuilt cubin for the GPU, else PTX, else NVRTC) and are loaded with `module_from_buffer`.
PyCUDA has no graph API: `begin_capture`/`end_capture` record the stream through
`cuda.bindings.driver` on PyCUDA's stream handle. Every driver error becomes a BackendError
that says what was being done.
"""

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from backends.cuda.device import Device, Dim3, Graph, KernelArg
from backends.cuda.modules import kernel_image
from backends.cuda.probe import GpuInfo
from backends.errors import BackendError

# (module, compute capability, driver version) -> (image bytes, where it came from), as `kernel_image`
ImageSource = Callable[[str, tuple[int, int], int], tuple[bytes, str]]


def _check(call: str, result: tuple[Any, ...]) -> tuple[Any, ...]:
    """The values a `cuda.bindings.driver` call returned after its CUresult; BackendError if it failed."""
    from cuda.bindings import driver

    error, *values = result
    if error != driver.CUresult.CUDA_SUCCESS:
        raise BackendError(f"cuda: {call} failed ({error.name})")
    return tuple(values)


class CudaGraph(Graph):
    """A recorded stream, instantiated once and launched on the device's stream."""

    def __init__(self, device: "PyCudaDevice", graph: Any, executable: Any):
        self._device, self._graph, self._executable = device, graph, executable

    def replay(self) -> None:
        """Launch the recorded kernels again on the device's stream."""
        from cuda.bindings import driver

        with self._device.current("replaying a graph"):
            _check("cuGraphLaunch", driver.cuGraphLaunch(self._executable, self._device.stream_handle))

    def __del__(self) -> None:
        from cuda.bindings import driver

        if not self._device.closed:
            with self._device.current("releasing a graph"):
                driver.cuGraphExecDestroy(self._executable)
                driver.cuGraphDestroy(self._graph)


class PyCudaDevice(Device):
    """GPU `ordinal` through PyCUDA: its memory, our kernel modules, one stream. `images` finds
    a kernel file's image (the tests pass one of their own kernels)."""

    name = "pycuda"

    def __init__(self, ordinal: int = 0, images: ImageSource = kernel_image):
        import pycuda.driver as cuda

        self._cuda = cuda
        self._images = images
        try:
            cuda.init()
            gpu = cuda.Device(ordinal)
            self._context = gpu.retain_primary_context()
        except cuda.Error as exc:
            raise BackendError(f"cuda: starting GPU {ordinal} failed: {exc}") from exc
        self.closed = False
        with self.current("making a stream"):
            self._stream = cuda.Stream()
            self.capability: tuple[int, int] = gpu.compute_capability()
            self.gpu = GpuInfo(gpu.name(), self.capability, gpu.total_memory())
            self.driver_version: int = cuda.get_driver_version()
        self.stream_handle = self._stream.handle
        self._allocations: dict[int, Any] = {}  # pointer -> its DeviceAllocation, alive until freed
        self._modules: dict[str, Any] = {}
        self._functions: dict[tuple[str, str], Any] = {}
        self.images: dict[str, str] = {}  # module -> which image was loaded (kernel_image's second value)

    @property
    def description(self) -> str:
        """The GPU's name, compute capability and memory."""
        return self.gpu.description

    @contextlib.contextmanager
    def current(self, doing: str) -> Iterator[None]:
        """The device's context made current for a block of driver calls; PyCUDA's errors in it
        become BackendErrors naming what was being done."""
        self._context.push()
        try:
            yield
        except self._cuda.Error as exc:
            raise BackendError(f"cuda: {doing} failed: {exc}") from exc
        finally:
            self._cuda.Context.pop()

    def alloc(self, nbytes: int) -> int:
        """A new buffer (cuMemAlloc aligns to 256 bytes at least)."""
        with self.current(f"allocating {nbytes:,} bytes"):
            allocation = self._cuda.mem_alloc(nbytes)
        ptr = int(allocation)
        self._allocations[ptr] = allocation
        return ptr

    def free(self, ptr: int) -> None:
        """Release a buffer from `alloc`."""
        with self.current("freeing a buffer"):
            self._allocations.pop(ptr).free()

    def upload(self, ptr: int, host: np.ndarray) -> None:
        """Queue a host-to-device copy; `host` may be reused on return (pageable memory is staged)."""
        with self.current("copying to the GPU"):
            self._cuda.memcpy_htod_async(ptr, host, self._stream)

    def download(self, host: np.ndarray, ptr: int) -> None:
        """Copy device memory into `host` once the stream's earlier work is done."""
        with self.current("copying from the GPU"):
            self._cuda.memcpy_dtoh_async(host, ptr, self._stream)
            self._stream.synchronize()

    def copy(self, dst: int, src: int, nbytes: int) -> None:
        """Queue a device-to-device copy."""
        with self.current("copying on the GPU"):
            self._cuda.memcpy_dtod_async(dst, src, nbytes, self._stream)

    def memset(self, ptr: int, value: int, nbytes: int) -> None:
        """Queue setting `nbytes` bytes to `value`."""
        with self.current("setting memory"):
            self._cuda.memset_d8_async(ptr, value, nbytes, self._stream)

    def function(self, module: str, name: str) -> Any:
        """Kernel `name` of kernel file `module`, loading the module's image on first use."""
        key = (module, name)
        if key not in self._functions:
            with self.current(f"loading kernel {name} of {module}"):
                if module not in self._modules:
                    image, source = self._images(module, self.capability, self.driver_version)
                    if not image.startswith(b"\x7fELF"):
                        image += b"\0"  # PTX is loaded as a NUL-terminated string
                    self._modules[module] = self._cuda.module_from_buffer(image)
                    self.images[module] = source
                self._functions[key] = self._modules[module].get_function(name)
        return self._functions[key]

    def launch(self, function: Any, grid: Dim3, block: Dim3, args: Sequence[KernelArg]) -> None:
        """Queue `function` on the stream."""
        with self.current("launching a kernel"):
            function(*args, block=block, grid=grid, stream=self._stream)

    def synchronize(self) -> None:
        """Wait for the stream."""
        with self.current("waiting for the GPU"):
            self._stream.synchronize()

    def begin_capture(self) -> None:
        """Record the stream's launches from now on. Relaxed mode: the backend's buffer pool may
        allocate while a step is recorded, which global mode refuses."""
        from cuda.bindings import driver

        mode = driver.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED
        with self.current("starting a graph"):
            _check("cuStreamBeginCapture", driver.cuStreamBeginCapture(self.stream_handle, mode))

    def end_capture(self) -> Graph:
        """Stop recording; the recorded graph, instantiated."""
        from cuda.bindings import driver

        with self.current("finishing a graph"):
            (graph,) = _check("cuStreamEndCapture", driver.cuStreamEndCapture(self.stream_handle))
            (executable,) = _check("cuGraphInstantiate", driver.cuGraphInstantiate(graph, 0))
        return CudaGraph(self, graph, executable)

    def close(self) -> None:
        """Free every buffer, drop the modules and release the context. Idempotent."""
        if self.closed:
            return
        with self.current("closing the GPU"):
            self._stream.synchronize()
            for allocation in self._allocations.values():
                allocation.free()
        self._allocations.clear()
        self._functions.clear()
        self._modules.clear()
        self.closed = True
        self._context.detach()
