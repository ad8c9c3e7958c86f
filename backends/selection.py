"""Choosing a backend, and saying why the others were passed over.

A GPU that is silently not used is the most common complaint about desktop LLM apps,
so `select` returns a reason for every backend it did not pick, and the GUI shows them.
"""

import importlib.util
import platform

from backends import cpu_native
from backends.base import Backend
from backends.errors import BackendUnavailable
from backends.numpy_backend import NumpyBackend

PREFERENCES = ("auto", "cpu", "numpy", "mlx", "cuda")
_CPU_SIDE = ("cpu", "numpy")


def _is_apple_silicon() -> bool:
    return platform.system() == "Darwin" and platform.machine() == "arm64"


def _mlx(preference: str) -> tuple[Backend | None, str]:
    """The MLX backend if `preference` lets it run here, else None; and why it was not used.

    Outside Apple silicon MLX computes on the CPU, more slowly than NumPy, so "auto" passes
    it over there; naming it ("mlx") still gives it.
    """
    if importlib.util.find_spec("mlx") is None:
        return None, "mlx: the mlx package is not installed (pip install 'sprig[mlx]')"
    if preference == "auto" and not _is_apple_silicon():
        where = f"{platform.system()} {platform.machine()}"
        return None, (
            f"mlx: not Apple silicon ({where}: MLX runs on the CPU there, slower than NumPy; "
            "choose it explicitly to use it)"
        )
    if preference in _CPU_SIDE:
        return None, f"mlx: not chosen (the {preference} backend was asked for)"
    try:
        from backends.mlx_backend import MLXBackend

        return MLXBackend(), ""
    except (ImportError, OSError, RuntimeError) as exc:
        return None, f"mlx: MLX is installed but does not start here ({exc})"


def _cuda_unavailable_reason() -> str:
    """Why CUDA cannot be used here."""
    if importlib.util.find_spec("pycuda") is None:
        return "cuda: pycuda is not installed (pip install 'sprig[cuda]')"
    return "cuda: Sprig's CUDA backend is not part of this version yet"


def _cpu(preference: str, threads: int | None) -> tuple[Backend | None, str]:
    """The native CPU backend unless `preference` names NumPy; and why it was not used."""
    if preference == "numpy":
        return None, "cpu: not chosen (the numpy backend was asked for)"
    try:
        from backends.cpu_backend import CpuBackend

        return CpuBackend(threads), ""
    except BackendUnavailable as exc:
        return None, str(exc)


def planned_backend(preference: str) -> str:
    """The name of the backend `select(preference)` would start, without starting it (the
    model picker estimates memory with it)."""
    if preference != "auto":
        return preference
    if _is_apple_silicon() and importlib.util.find_spec("mlx") is not None:
        return "mlx"
    try:
        cpu_native.runnable_tiers()
    except BackendUnavailable:
        return "numpy"
    return "cpu"


def select(preference: str = "auto", threads: int | None = None) -> tuple[Backend, list[str]]:
    """Return a ready backend for `preference` and the reasons the others were passed over.

    "auto" takes the first of CUDA, MLX (on Apple silicon only), the native CPU kernels
    and NumPy that can run; NumPy always can. Naming a backend that cannot run raises
    BackendUnavailable with the reason. `threads` is the cpu backend's thread count
    (default: the physical cores).
    """
    if preference not in PREFERENCES:
        raise BackendUnavailable(f"unknown backend {preference!r}; choose one of {', '.join(PREFERENCES)}")
    reasons = [_cuda_unavailable_reason()]
    if preference == "cuda":
        raise BackendUnavailable(reasons[0])
    mlx, why_not_mlx = _mlx(preference)
    if mlx is not None:
        return mlx, reasons
    if preference == "mlx":
        raise BackendUnavailable(why_not_mlx)
    reasons.append(why_not_mlx)
    cpu, why_not_cpu = _cpu(preference, threads)
    if cpu is not None:
        return cpu, reasons
    if preference == "cpu":
        raise BackendUnavailable(why_not_cpu)
    return NumpyBackend(), [*reasons, why_not_cpu]
