"""Builds the native CPU backend's kernels, once per instruction-set tier.

The same C sources (backends/cpu_kernels/) become one extension module per tier, each
compiled with its own flags and never with -march=native; `backends.cpu_native` picks the
best one the CPU supports at run time. Every module is optional: if the compiler fails,
Sprig still installs and runs on NumPy, and the backend list says why.
"""

import platform

from setuptools import Extension, setup

SOURCES = [
    f"backends/cpu_kernels/{name}.c"
    for name in (
        "module", "ops", "attention", "delta_net", "quants", "codes8_dots", "int16_panels", "byte_panels", "iq_dots", "q1_tiles", "tq_tiles", "row_tiles", "pool",
        "scratch",
    )
]
COMMON_FLAGS = ["-O3", "-std=gnu11", "-ffp-contract=off", "-fno-math-errno", "-pthread", "-Wno-psabi", "-Werror=implicit-function-declaration"]


def tiers() -> dict[str, list[str]]:
    """Compiler flags of each tier this platform can build, the portable one first."""
    machine = platform.machine().lower()
    found = {"scalar": []}
    if machine in ("x86_64", "amd64"):
        found["avx2"] = ["-mavx2", "-mfma", "-mf16c"]
        found["avx512"] = ["-mavx2", "-mfma", "-mf16c", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni"]
        found["avx512_ymm"] = found["avx512"] + ["-DSPRIG_YMM"]  # backends/cpu_native.py says when
    elif machine in ("aarch64", "arm64"):
        found["neon"] = []  # NEON is baseline on arm64
    return found


def extension(tier: str, flags: list[str]) -> Extension:
    """The module backends._cpu_<tier>."""
    name = f"_cpu_{tier}"
    return Extension(f"backends.{name}", SOURCES, depends=["backends/cpu_kernels/kernels.h",
                     "backends/cpu_kernels/ops.h", "backends/cpu_kernels/simd.h",
                     "backends/cpu_kernels/iq_grids.h", "backends/cpu_kernels/iq_signs.h", "backends/cpu_kernels/bytes.h",
                     "backends/cpu_kernels/tiles.h", "backends/cpu_kernels/int16_words.h",
                     "backends/cpu_kernels/panels.h"],
                     extra_compile_args=COMMON_FLAGS + flags + [f"-DSPRIG_MODULE={name}"],
                     extra_link_args=["-pthread"], optional=True)


setup(ext_modules=[extension(tier, flags) for tier, flags in tiers().items()])
