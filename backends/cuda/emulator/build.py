"""Builds a `.cu` kernel file into a shared library for the CUDA emulator.

The kernel file is compiled as C++ by the host compiler with `cuda_emu.h` force-included and
`include/` (the emulator's `cuda_fp16.h` and `cuda_bf16.h`) first on the include path, linked
with the fiber runtime (`fibers.cpp`). For every kernel the build adds a launch thunk

    extern "C" int emu_launch_<name>(unsigned gx, unsigned gy, unsigned gz,
                                     unsigned bx, unsigned by, unsigned bz,
                                     void** args, int order, unsigned long long seed);

where `args[i]` points to the value of the kernel's i-th parameter (cuLaunchKernel's
`kernelParams` convention), and `extern "C" const char* emu_params_<name>()`, the parameters'
kinds and sizes ("p8,i4,f4": pointer, signed/unsigned integer, floating point, other).

Kernels are found by one declaration form, the one the backend's kernels use:

    extern "C" __global__ void [__launch_bounds__(...)] name(...)

(whitespace and line breaks anywhere between the words; comments are ignored; a kernel inside a
disabled `#if` still gets a thunk, and the build fails on it). Libraries are cached in the user
cache directory (`SPRIG_CUDA_EMULATOR_CACHE` overrides it), keyed by a hash of every source
involved, the flags and the compiler's version; each is written under a temporary name and
renamed, so concurrent builds are safe.
"""

import functools
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import platformdirs

from backends.errors import BackendError, BackendUnavailable

EMULATOR_DIR = Path(__file__).resolve().parent
HEADER = EMULATOR_DIR / "cuda_emu.h"
LAUNCH_HEADER = EMULATOR_DIR / "launch.h"
INCLUDE_DIR = EMULATOR_DIR / "include"
RUNTIME = EMULATOR_DIR / "fibers.cpp"

FLAGS = ("-O2", "-std=c++17", "-fPIC", "-ffp-contract=off")
ASAN_FLAGS = ("-fsanitize=address", "-fno-omit-frame-pointer", "-g")

_KERNEL = re.compile(r'extern\s+"C"\s+__global__\s+void\s+(?:__launch_bounds__\s*\([^()]*\)\s*)?([A-Za-z_]\w*)\s*\(')
_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.DOTALL)
_LOCAL_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.MULTILINE)
_DYNAMIC_SHARED = re.compile(r"\bextern\s+__shared__\b")


def kernel_names(source: str) -> list[str]:
    """The names of the `extern "C" __global__ void` kernels declared in `source`, in order."""
    return _KERNEL.findall(_COMMENT.sub(" ", source))


def compiler() -> str:
    """The host C++ compiler: `$CXX`, else g++."""
    return os.environ.get("CXX", "g++")


@functools.cache
def compiler_version(cxx: str) -> str:
    """`cxx --version`'s first line (part of the cache key); BackendUnavailable without one."""
    if shutil.which(cxx) is None:
        raise BackendUnavailable(f"cuda emulator: no C++ compiler ({cxx}) on PATH")
    out = subprocess.run([cxx, "--version"], capture_output=True, text=True, check=False).stdout
    return out.splitlines()[0] if out else cxx


def asan_runtime() -> Path:
    """The compiler's AddressSanitizer runtime, which a process must preload (LD_PRELOAD) to load an ASan build."""
    out = subprocess.run([compiler(), "-print-file-name=libasan.so"], capture_output=True, text=True, check=False)
    return Path(out.stdout.strip())


def cache_dir() -> Path:
    """Where built libraries are kept: `$SPRIG_CUDA_EMULATOR_CACHE`, else the user cache dir's sprig/cuda-emulator."""
    override = os.environ.get("SPRIG_CUDA_EMULATOR_CACHE")
    path = Path(override) if override else Path(platformdirs.user_cache_dir("sprig")) / "cuda-emulator"
    path.mkdir(parents=True, exist_ok=True)
    return path


def local_sources(path: Path, seen: dict[Path, str] | None = None) -> dict[Path, str]:
    """`path` and every file it includes with `#include "..."` (found beside the including file), recursively,
    mapped to their text."""
    seen = {} if seen is None else seen
    path = path.resolve()
    if path in seen:
        return seen
    text = path.read_text()
    seen[path] = text
    for name in _LOCAL_INCLUDE.findall(_COMMENT.sub(" ", text)):
        included = path.parent / name
        if included.is_file():
            local_sources(included, seen)
    return seen


def _refuse_dynamic_shared(sources: dict[Path, str]) -> None:
    for path, text in sources.items():
        match = _DYNAMIC_SHARED.search(_COMMENT.sub(lambda m: re.sub(r"[^\n]", " ", m.group()), text))
        if match:
            line = text.count("\n", 0, match.start()) + 1
            raise BackendError(
                f"{path}:{line}: `extern __shared__` (dynamic shared memory) is not supported by the CUDA emulator; "
                "declare a static `__shared__` array instead"
            )


def thunk_source(cu_path: Path, names: list[str]) -> str:
    """The C++ translation unit that includes the kernel file and adds one launch thunk per kernel."""
    lines = [f'#include "{cu_path}"', f'#include "{LAUNCH_HEADER}"', ""]
    for name in names:
        lines += [
            f'extern "C" __attribute__((visibility("default"))) int emu_launch_{name}(',
            "    unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,",
            "    void** args, int order, unsigned long long seed) {",
            f"    auto body = [](void** a) {{ ::cuda_emu::call_with_args(&{name}, a); }};",
            f'    return emu_run("{name}", body, args, gx, gy, gz, bx, by, bz, order, seed);',
            "}",
            f'extern "C" __attribute__((visibility("default"))) const char* emu_params_{name}() {{',
            f"    static const std::string params = ::cuda_emu::describe_params(&{name});",
            "    return params.c_str();",
            "}",
            "",
        ]
    return "\n".join(lines)


def _run_compiler(args: list[str], what: str) -> None:
    result = subprocess.run(args, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        log = (result.stderr or result.stdout).strip()
        raise BackendError(f"cuda emulator: compiling {what} failed:\n{log[-6000:]}")


def _hash(*parts: str) -> str:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part.encode())
        digest.update(b"\0")
    return digest.hexdigest()[:20]


def _publish(build: Path, target: Path) -> Path:
    """Moves a finished build to its cache name atomically (another process may have done the same)."""
    os.replace(build, target)
    return target


def _emulator_sources() -> str:
    return "".join(p.read_text() for p in (HEADER, LAUNCH_HEADER, RUNTIME, *sorted(INCLUDE_DIR.glob("*.h"))))


def _runtime_object(flags: list[str], key: str, directory: Path) -> Path:
    """The fiber runtime compiled once per flag set and compiler (cached like the modules)."""
    target = directory / f"runtime-{key}.o"
    if target.exists():
        return target
    with tempfile.TemporaryDirectory(dir=directory, prefix=".build-") as tmp:
        build = Path(tmp) / target.name
        _run_compiler([compiler(), *flags, "-c", "-x", "c++", str(RUNTIME), "-o", str(build)], "the emulator runtime")
        return _publish(build, target)


def build_module(cu_path: Path, asan: bool = False) -> Path:
    """The emulator's shared library for kernel file `cu_path` (built, or found in the cache); with `asan`, an
    AddressSanitizer build, which loads only into a process that preloads `asan_runtime()`."""
    cu_path = Path(cu_path).resolve()
    if not cu_path.is_file():
        raise BackendError(f"cuda emulator: no kernel file {cu_path}")
    cxx = compiler()
    version = compiler_version(cxx)
    sources = local_sources(cu_path)
    _refuse_dynamic_shared(sources)
    names = kernel_names(sources[cu_path])
    flags = [*FLAGS, *(ASAN_FLAGS if asan else ())]
    directory = cache_dir()
    emulator = _emulator_sources()
    runtime = _runtime_object(flags, _hash(version, *flags, emulator), directory)
    wrapper = thunk_source(cu_path, names)
    key = _hash(version, *flags, emulator, wrapper, *(f"{p}\n{t}" for p, t in sorted(sources.items())))
    target = directory / f"{cu_path.stem}{'-asan' if asan else ''}-{key}.so"
    if target.exists():
        return target
    with tempfile.TemporaryDirectory(dir=directory, prefix=".build-") as tmp:
        source = Path(tmp) / f"{cu_path.stem}_emulator.cpp"
        source.write_text(wrapper)
        build = Path(tmp) / target.name
        command = [
            cxx,
            *flags,
            "-shared",
            "-include",
            str(HEADER),
            "-I",
            str(INCLUDE_DIR),
            "-I",
            str(cu_path.parent),
            "-x",
            "c++",
            str(source),
            "-x",
            "none",
            str(runtime),
            "-o",
            str(build),
            "-pthread",
            "-Wl,-z,defs",
        ]
        _run_compiler(command, str(cu_path))
        return _publish(build, target)
