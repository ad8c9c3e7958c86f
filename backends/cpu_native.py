"""Loading the native CPU kernels: the best instruction-set tier this CPU runs, or why none.

`setup.py` builds the C sources in `backends/cpu_kernels/` once per tier, as the modules
`backends._cpu_<tier>`. This module asks the always-built portable one which features the
CPU has, and imports the fastest tier that it supports. `SPRIG_CPU_TIER` forces a tier
(for tests and bug reports); `SPRIG_CPU_THREADS` sets the thread count.
"""

import importlib
import os
from types import ModuleType

import psutil

from backends.errors import BackendUnavailable

TIER_ENV = "SPRIG_CPU_TIER"
THREADS_ENV = "SPRIG_CPU_THREADS"
# Fastest first, with the CPU features each one's code uses.
AVX512 = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512vnni")
TIERS: dict[str, tuple[str, ...]] = {
    "avx512": AVX512,
    # the same instructions, its decode products of the types on 32-weight blocks and on
    # 8-bit codes in 256-bit registers: faster where a core runs 512-bit operations in halves
    "avx512_ymm": AVX512,
    "avx2": ("avx2", "fma", "f16c"),
    "neon": ("neon",),
    "scalar": (),
}


def _module(tier: str) -> ModuleType | None:
    try:
        return importlib.import_module(f"backends._cpu_{tier}")
    except ImportError:
        return None


def _portable() -> ModuleType:
    portable = _module("scalar")
    if portable is None:
        raise BackendUnavailable(
            "cpu: the native kernels were not built when Sprig was installed (a C compiler is needed; "
            "reinstall with `pip install -e .` and read its output)"
        )
    return portable


def runnable_tiers() -> list[str]:
    """The tiers that were built and that this CPU can run, fastest first."""
    portable = _portable()
    order = list(TIERS)
    if portable.cpu_has("avx512_halves"):  # AMD Zen 4: avx512_ymm first (docs/performance-notes.md)
        order.remove("avx512_ymm")
        order.insert(0, "avx512_ymm")
    return [tier for tier in order if all(portable.cpu_has(f) for f in TIERS[tier]) and _module(tier) is not None]


def load(tier: str | None = None) -> ModuleType:
    """The kernel module of `tier`, or of the tier `SPRIG_CPU_TIER` names, or of the fastest
    runnable one. Raises BackendUnavailable, saying why, when it cannot run here."""
    tier = tier or os.environ.get(TIER_ENV) or None
    runnable = runnable_tiers()
    if tier is None:
        return _module(runnable[0])  # type: ignore[return-value]  # runnable tiers are built ones
    if tier not in TIERS:
        raise BackendUnavailable(
            f"cpu: unknown instruction-set tier {tier!r} ({TIER_ENV}); choose one of {', '.join(TIERS)}"
        )
    if tier not in runnable:
        raise BackendUnavailable(
            f"cpu: the {tier} kernels cannot run here (this CPU and build run: {', '.join(runnable)})"
        )
    return _module(tier)  # type: ignore[return-value]  # in runnable: built


def default_threads() -> int:
    """`SPRIG_CPU_THREADS` if set, else the number of physical cores."""
    value = os.environ.get(THREADS_ENV)
    if value:
        try:
            return max(1, int(value))
        except ValueError:
            raise BackendUnavailable(f"cpu: {THREADS_ENV}={value!r} is not a whole number of threads") from None
    return psutil.cpu_count(logical=False) or os.cpu_count() or 1
