"""Choosing a backend, and saying why the others were passed over.

A GPU that is silently not used is the most common complaint about desktop LLM apps,
so `select` returns a reason for every backend it did not pick, and the GUI shows them.
"""

import importlib.util
import platform

from backends.base import Backend
from backends.errors import BackendUnavailable
from backends.numpy_backend import NumpyBackend

PREFERENCES = ("auto", "numpy", "mlx", "cuda")


def _is_apple_silicon() -> bool:
    return platform.system() == "Darwin" and platform.machine() == "arm64"


def _mlx_unavailable_reason(asked: bool) -> str:
    """Why MLX cannot be used here."""
    if importlib.util.find_spec("mlx") is None:
        return "mlx: the mlx package is not installed (pip install 'sprig[mlx]')"
    if not asked and not _is_apple_silicon():
        return "mlx: not Apple silicon (MLX on Linux runs on the CPU, slower than NumPy; choose it explicitly to use it)"
    return "mlx: Sprig's MLX backend is not part of this version yet"


def _cuda_unavailable_reason() -> str:
    """Why CUDA cannot be used here."""
    if importlib.util.find_spec("pycuda") is None:
        return "cuda: pycuda is not installed (pip install 'sprig[cuda]')"
    return "cuda: Sprig's CUDA backend is not part of this version yet"


def select(preference: str = "auto") -> tuple[Backend, list[str]]:
    """Return a ready backend for `preference` and the reasons the others were passed over.

    "auto" takes the first of CUDA, MLX (on Apple silicon only) and NumPy that can run;
    NumPy always can. Naming a backend that cannot run raises BackendUnavailable with
    the reason.
    """
    if preference not in PREFERENCES:
        raise BackendUnavailable(f"unknown backend {preference!r}; choose one of {', '.join(PREFERENCES)}")
    reasons = {
        "cuda": _cuda_unavailable_reason(),
        "mlx": _mlx_unavailable_reason(asked=preference == "mlx"),
    }
    if preference in reasons:
        raise BackendUnavailable(reasons[preference])
    return NumpyBackend(), list(reasons.values())
