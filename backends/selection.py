"""Choosing a backend, and saying why the others were passed over.

A GPU that is silently not used is the most common complaint about desktop LLM apps,
so `select` returns a reason for every backend it did not pick, and the GUI shows them.

`REGISTRY` lists every backend, fastest first, as an entry that can start it or say why
it cannot, and that carries its memory rule so the app can estimate a model's needs
without starting anything. CUDA's entry probes the NVIDIA driver before PyCUDA is imported
(`backends.cuda.probe`), so a machine without one hears why in a sentence, not a traceback.
`SPRIG_CUDA_DEVICE=emulator` with `--backend cuda` runs the CUDA backend's kernels on the CPU
emulator instead (development and CI; far slower than the cpu backend, so `auto` never does).
"""

import importlib.util
import os
import platform
from collections.abc import Callable
from dataclasses import dataclass

from backends import cpu_native
from backends.base import Backend
from backends.errors import BackendError, BackendUnavailable
from backends.memory import DEQUANTIZED_WEIGHTS, MAPPED_WEIGHTS, MemoryRule
from backends.numpy_backend import NumpyBackend

_CPU_SIDE = ("cpu", "numpy")


@dataclass(frozen=True)
class BackendEntry:
    """One backend: its name, its memory rule, how to start it (`start(preference, threads)`
    returns it, or raises BackendUnavailable saying why not), and a cheap guess, starting
    nothing, of whether `auto` would take it here."""

    name: str
    memory_rule: MemoryRule
    start: Callable[[str, int | None], Backend]
    likely: Callable[[], bool]


def _is_apple_silicon() -> bool:
    return platform.system() == "Darwin" and platform.machine() == "arm64"


def _start_cuda(preference: str, threads: int | None) -> Backend:
    """The CUDA backend on the GPU when the driver, a GPU and PyCUDA are there, or on the
    emulator when `SPRIG_CUDA_DEVICE=emulator` and "cuda" was asked for by name."""
    if preference in _CPU_SIDE or preference == "mlx":
        raise BackendUnavailable(f"cuda: not chosen (the {preference} backend was asked for)")
    from backends.cuda.probe import probe, unavailable_reason

    if os.environ.get("SPRIG_CUDA_DEVICE") == "emulator":
        if preference != "cuda":
            raise BackendUnavailable("cuda: SPRIG_CUDA_DEVICE=emulator runs only when the cuda backend is chosen")
        from backends.cuda.backend import CudaBackend
        from backends.cuda.emulator_device import EmulatorDevice

        return CudaBackend(EmulatorDevice())
    reason = unavailable_reason(probe())
    if reason is not None:
        raise BackendUnavailable(reason)
    from backends.cuda.backend import CudaBackend
    from backends.cuda.pycuda_device import PyCudaDevice

    try:
        return CudaBackend(PyCudaDevice())
    except BackendError as exc:  # the driver refused a context or a module: say what it said
        raise BackendUnavailable(f"cuda: the GPU did not start ({str(exc).removeprefix('cuda: ')})") from exc


def _cuda_likely() -> bool:
    from backends.cuda.probe import probe, unavailable_reason

    return unavailable_reason(probe()) is None


def _start_mlx(preference: str, threads: int | None) -> Backend:
    """The MLX backend if `preference` lets it run here.

    Outside Apple silicon MLX computes on the CPU, more slowly than NumPy, so "auto" passes
    it over there; naming it ("mlx") still gives it.
    """
    if importlib.util.find_spec("mlx") is None:
        raise BackendUnavailable("mlx: the mlx package is not installed (pip install 'sprig[mlx]')")
    if preference == "auto" and not _is_apple_silicon():
        where = f"{platform.system()} {platform.machine()}"
        raise BackendUnavailable(
            f"mlx: not Apple silicon ({where}: MLX runs on the CPU there, slower than NumPy; "
            "choose it explicitly to use it)"
        )
    if preference in _CPU_SIDE:
        raise BackendUnavailable(f"mlx: not chosen (the {preference} backend was asked for)")
    try:
        from backends.mlx_backend import MLXBackend

        return MLXBackend()
    except (ImportError, OSError, RuntimeError) as exc:
        raise BackendUnavailable(f"mlx: MLX is installed but does not start here ({exc})") from exc


def _start_cpu(preference: str, threads: int | None) -> Backend:
    """The native CPU backend unless `preference` names NumPy."""
    if preference == "numpy":
        raise BackendUnavailable("cpu: not chosen (the numpy backend was asked for)")
    from backends.cpu_backend import CpuBackend

    return CpuBackend(threads)


def _mlx_likely() -> bool:
    return _is_apple_silicon() and importlib.util.find_spec("mlx") is not None


def _cpu_likely() -> bool:
    try:
        return bool(cpu_native.runnable_tiers())
    except BackendUnavailable:
        return False


REGISTRY: tuple[BackendEntry, ...] = (
    BackendEntry("cuda", MAPPED_WEIGHTS, _start_cuda, _cuda_likely),
    BackendEntry(
        "mlx", MAPPED_WEIGHTS, _start_mlx, lambda: _is_apple_silicon() and bool(importlib.util.find_spec("mlx"))
    ),
    BackendEntry("cpu", MAPPED_WEIGHTS, _start_cpu, _cpu_likely),
    BackendEntry("numpy", DEQUANTIZED_WEIGHTS, lambda preference, threads: NumpyBackend(), lambda: True),
)
PREFERENCES = ("auto", *(entry.name for entry in REGISTRY))


def entry(name: str) -> BackendEntry:
    """The registry entry of the backend `name`."""
    for candidate in REGISTRY:
        if candidate.name == name:
            return candidate
    raise BackendUnavailable(f"unknown backend {name!r}; choose one of {', '.join(PREFERENCES)}")


def planned_backend(preference: str) -> str:
    """The name of the backend `select(preference)` would start, without starting it (the
    model picker estimates memory with its rule)."""
    if preference != "auto":
        return preference
    return next(candidate.name for candidate in REGISTRY if candidate.likely())


def select(preference: str = "auto", threads: int | None = None) -> tuple[Backend, list[str]]:
    """Return a ready backend for `preference` and the reasons the others were passed over.

    "auto" takes the first entry of REGISTRY that can run (MLX on Apple silicon only);
    NumPy always can. Naming a backend that cannot run raises BackendUnavailable with the
    reason. `threads` is the cpu backend's thread count (default: the physical cores).
    """
    if preference != "auto":
        entry(preference)  # an unknown name is refused first
    reasons: list[str] = []
    for candidate in REGISTRY:  # each start refuses a preference that passes it over, saying so
        try:
            return candidate.start(preference, threads), reasons
        except BackendUnavailable as exc:
            if preference == candidate.name:
                raise
            reasons.append(str(exc))
    raise AssertionError("unreachable: the NumPy backend always starts")
