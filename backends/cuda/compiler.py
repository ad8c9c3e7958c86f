"""Compiling the CUDA kernels without a GPU or a driver, and reading what they cost.

Two compilers:

- **NVRTC 12.9** from the `nvidia-cuda-nvrtc-cu12` wheel (the `cuda-build` extra), called
  in-process through ctypes. It makes the cubins users get (sm_61 and newer) and the PTX
  for GPUs newer than any cubin. Headers such as `cuda_fp16.h` come from the
  `nvidia-cuda-runtime-cu12` wheel's `include/`.
- **nvcc**, the machine's CUDA 13 toolkit, with warnings as errors: a second, stricter
  front end over the same sources (sm_75 and newer only).

Both run ptxas verbosely; `parse_ptxas_log` turns its log into one `KernelResources` per
`extern "C" __global__` kernel. Each kernel's `__launch_bounds__` block size is read from
the PTX (`.maxntid`), where the compiler has already evaluated whatever macro or constant
the source wrote. `problems` lists what would make a kernel fail or slow down on a real
GPU: a warning, a spill, a register file or static shared memory that its block cannot fit.

`-default-device` is not passed: nvcc has no such option, and the same sources must build
under both compilers and the CPU emulator, so every device function says `__device__`.
"""

import ctypes
import functools
import importlib.util
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from backends.errors import BackendError, BackendUnavailable

KERNELS_DIR = Path(__file__).resolve().parent / "kernels"

# The cubins users get: one per major architecture and every minor that adds instructions
# or changes scheduling, from the GTX 10 series (6.1) to Blackwell (10.0, 12.x). A cubin
# runs on its own major version at the same or a higher minor, so sm_61 serves 6.1/6.2,
# sm_70 Volta (7.0/7.2), sm_86 also serves 8.7, and sm_120 12.x.
# Users also get the PTX of the newest (compute_120), which a driver JIT-compiles for GPUs
# newer than any cubin.
CUBIN_ARCHS = ("sm_61", "sm_70", "sm_75", "sm_80", "sm_86", "sm_89", "sm_90", "sm_100", "sm_120")
# The second front end's targets: nvcc 13 compiles for sm_75 and newer only.
NVCC_ARCHS = ("sm_75", "sm_80", "sm_86", "sm_89", "sm_90", "sm_120")

REGISTER_FILE = 65536  # 32-bit registers per SM and per block, on every architecture above
REGISTERS_PER_WARP_UNIT = 256  # registers are given to a warp in units of this many
STATIC_SHARED_LIMIT = 48 * 1024  # bytes of static __shared__ a block may declare
MAX_BLOCK_THREADS = 1024  # what a launch may use when a kernel declares no __launch_bounds__

_COMMON_OPTIONS = ("--std=c++17",)
# Line info lets compute-sanitizer and profilers name source lines; it makes a cubin about four times
# larger and changes no register or spill, so the cubins users get are built without it.
_LINE_INFO = "-lineinfo"
_WARNING = re.compile(r"\bwarning\s*(#[\w-]+\s*)?:")  # "warning #177-D:", "nvrtc: warning:", "ptxas warning :"
# NVRTC warns that sm_61 and sm_70 are deprecated, and has no option to say they are still wanted.
_DEPRECATED_TARGET = re.compile(r"Architectures prior to .* are deprecated")


class CompileError(BackendError):
    """A kernel file did not compile; the message holds the compiler's log."""


@dataclass(frozen=True)
class KernelResources:
    """What ptxas gave one kernel for one architecture."""

    name: str
    registers: int
    spill_stores: int  # bytes
    spill_loads: int  # bytes
    stack: int  # bytes of stack frame (local arrays and spills)
    shared: int  # bytes of static __shared__ memory
    max_threads: int | None  # the block size of its __launch_bounds__, None when it declares none

    def problems(self) -> list[str]:
        """What would fail or slow down on a GPU: spills, a register file or static shared
        memory that a block of `max_threads` threads cannot fit. Empty when there is none."""
        found = []
        if self.spill_stores or self.spill_loads:
            found.append(
                f"{self.name}: spills registers ({self.spill_stores} bytes stored, {self.spill_loads} bytes loaded)"
            )
        threads = self.max_threads or MAX_BLOCK_THREADS
        needed = block_registers(self.registers, threads)
        if needed > REGISTER_FILE:
            bounds = "" if self.max_threads else " (no __launch_bounds__, so any block size up to 1024)"
            found.append(
                f"{self.name}: {self.registers} registers × {threads} threads{bounds} need {needed} registers, "
                f"more than the {REGISTER_FILE} of the register file"
            )
        if self.shared > STATIC_SHARED_LIMIT:
            found.append(f"{self.name}: {self.shared} bytes of static shared memory, over {STATIC_SHARED_LIMIT}")
        return found


@dataclass(frozen=True)
class Compiled:
    """One kernel file compiled for one target: the image, the PTX it was made from, the
    compiler's log, and each kernel's resources (none for a PTX target, which ptxas does not see)."""

    source: Path
    target: str  # "sm_90" (a cubin) or "compute_120" (PTX)
    compiler: str  # "NVRTC 12.9", "nvcc 13.0"
    image: bytes  # the cubin, or for a PTX target the PTX
    ptx: bytes  # ending with the NUL that cuModuleLoadData needs
    log: str
    kernels: tuple[KernelResources, ...]

    @property
    def warnings(self) -> list[str]:
        """The compiler's warning lines."""
        lines = (line.strip() for line in self.log.splitlines())
        return [line for line in lines if _WARNING.search(line) and not _DEPRECATED_TARGET.search(line)]

    def problems(self) -> list[str]:
        """Every warning and every kernel's problems (`KernelResources.problems`), each naming
        the file, the target and the compiler."""
        where = f"{self.source.name} ({self.compiler}, {self.target})"
        return [f"{where}: {problem}" for problem in self.warnings + [p for k in self.kernels for p in k.problems()]]


def block_registers(registers: int, threads: int) -> int:
    """Registers a block of `threads` threads takes from the register file, each warp's
    share rounded up to the allocation unit."""
    warps = -(-threads // 32)
    per_warp = -(-registers * 32 // REGISTERS_PER_WARP_UNIT) * REGISTERS_PER_WARP_UNIT
    return warps * per_warp


# -- reading the compilers' output -------------------------------------------------------

_ENTRY = re.compile(r"Compiling entry function '([^']+)' for")
_PROPERTIES = re.compile(r"Function properties for (\S+)")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers")
_SMEM = re.compile(r"(\d+) bytes smem")
_PTX_ENTRY = re.compile(r"\.entry\s+(\w+)\s*\(([^{]*)", re.DOTALL)
_PTX_THREADS = re.compile(r"\.(?:maxntid|reqntid)\s+(\d+)(?:\s*,\s*(\d+))?(?:\s*,\s*(\d+))?")


def ptx_block_sizes(ptx: str) -> dict[str, int | None]:
    """Each entry's `__launch_bounds__` block size (`.maxntid`, x·y·z), None where it has none."""
    sizes: dict[str, int | None] = {}
    for name, header in _PTX_ENTRY.findall(ptx):
        bounds = _PTX_THREADS.search(header)
        sizes[name] = None if bounds is None else int(bounds[1]) * int(bounds[2] or 1) * int(bounds[3] or 1)
    return sizes


def parse_ptxas_log(log: str, block_sizes: dict[str, int | None]) -> tuple[KernelResources, ...]:
    """The kernels in a `ptxas -v` log, in its order, with their block sizes from `block_sizes`."""
    found: dict[str, dict[str, int]] = {}
    entry: str | None = None  # the entry whose lines follow
    properties_of: str | None = None  # the function whose "stack frame" line comes next
    for line in log.splitlines():
        if match := _ENTRY.search(line):
            entry = match[1]
            found[entry] = {"registers": 0, "spill_stores": 0, "spill_loads": 0, "stack": 0, "shared": 0}
        elif match := _PROPERTIES.search(line):
            properties_of = match[1]
        elif (match := _FRAME.search(line)) and entry is not None and properties_of == entry:
            found[entry].update(stack=int(match[1]), spill_stores=int(match[2]), spill_loads=int(match[3]))
        elif (match := _USED.search(line)) and entry is not None:
            shared = _SMEM.search(line)
            found[entry].update(registers=int(match[1]), shared=int(shared[1]) if shared else 0)
    return tuple(KernelResources(name, **values, max_threads=block_sizes.get(name)) for name, values in found.items())


# -- NVRTC -------------------------------------------------------------------------------

_NVRTC_LIBRARY = {"linux": "lib/libnvrtc.so.12", "win32": "bin/nvrtc64_120_0.dll"}


def _wheel_dir(package: str) -> Path | None:
    """Where an `nvidia-*` wheel's namespace package lies, or None when it is not installed."""
    try:
        spec = importlib.util.find_spec(f"nvidia.{package}")
    except ModuleNotFoundError:
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


class Nvrtc:
    """NVRTC through ctypes: the library of the `nvidia-cuda-nvrtc-cu12` wheel, with the
    headers of `nvidia-cuda-runtime-cu12`."""

    def __init__(self) -> None:
        nvrtc_dir, runtime_dir = _wheel_dir("cuda_nvrtc"), _wheel_dir("cuda_runtime")
        library = _NVRTC_LIBRARY.get(sys.platform, _NVRTC_LIBRARY["linux"])
        if nvrtc_dir is None or not (nvrtc_dir / library).exists():
            raise BackendUnavailable("NVRTC is not installed (pip install 'nvidia-cuda-nvrtc-cu12==12.9.86')")
        if runtime_dir is None or not (runtime_dir / "include" / "cuda_fp16.h").exists():
            raise BackendUnavailable(
                "the CUDA headers are not installed (pip install 'nvidia-cuda-runtime-cu12==12.9.79')"
            )
        self.include = runtime_dir / "include"
        self._lib = ctypes.CDLL(str(nvrtc_dir / library))
        self._lib.nvrtcGetErrorString.restype = ctypes.c_char_p
        major, minor = ctypes.c_int(), ctypes.c_int()
        self._check(self._lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)), "nvrtcVersion")
        self.version = (major.value, minor.value)

    @property
    def name(self) -> str:
        """The compiler and its version: "NVRTC 12.9"."""
        return f"NVRTC {self.version[0]}.{self.version[1]}"

    def _check(self, result: int, call: str) -> None:
        """Raise CompileError unless an NVRTC call returned NVRTC_SUCCESS (0)."""
        if result != 0:
            raise CompileError(f"{call} failed: {self._lib.nvrtcGetErrorString(result).decode()}")

    def _read(self, program: ctypes.c_void_p, what: str) -> bytes:
        """One of the program's outputs: "ProgramLog", "PTX" or "CUBIN" (as nvrtcGet<what>)."""
        size = ctypes.c_size_t()
        self._check(getattr(self._lib, f"nvrtcGet{what}Size")(program, ctypes.byref(size)), f"nvrtcGet{what}Size")
        buffer = ctypes.create_string_buffer(size.value)
        self._check(getattr(self._lib, f"nvrtcGet{what}")(program, buffer), f"nvrtcGet{what}")
        return buffer.raw

    def compile(self, source: Path, target: str, line_info: bool = False) -> Compiled:
        """Compile `source` for `target`: "sm_XX" gives a cubin, "compute_XX" PTX; with source
        line info for the tools when `line_info`. Raises CompileError, with the log, when it
        does not compile."""
        program = ctypes.c_void_p()
        text = source.read_bytes()
        self._check(
            self._lib.nvrtcCreateProgram(ctypes.byref(program), text, source.name.encode(), 0, None, None),
            "nvrtcCreateProgram",
        )
        try:
            options = [
                f"--gpu-architecture={target}",
                f"-I{self.include}",
                f"-I{source.parent}",
                "--ptxas-options=-v",
                *_COMMON_OPTIONS,
                *([_LINE_INFO] if line_info else []),
            ]
            encoded = [option.encode() for option in options]
            result = self._lib.nvrtcCompileProgram(program, len(encoded), (ctypes.c_char_p * len(encoded))(*encoded))
            log = self._read(program, "ProgramLog").rstrip(b"\0").decode(errors="replace")
            if result != 0:
                raise CompileError(f"{source.name} does not compile for {target} ({self.name}):\n{log}")
            ptx = self._read(program, "PTX")
            image = self._read(program, "CUBIN") if target.startswith("sm_") else ptx
        finally:
            self._lib.nvrtcDestroyProgram(ctypes.byref(program))
        kernels = parse_ptxas_log(log, ptx_block_sizes(ptx.rstrip(b"\0").decode()))
        return Compiled(source, target, self.name, image, ptx, log, kernels)


@functools.cache
def nvrtc() -> Nvrtc:
    """The process's NVRTC, loaded on first use. Raises BackendUnavailable, saying what to
    install, when the wheels are missing."""
    return Nvrtc()


def compile_nvrtc(source: Path, target: str, line_info: bool = False) -> Compiled:
    """`source` compiled by NVRTC for `target` ("sm_90": a cubin; "compute_120": PTX), with
    source line info when `line_info`."""
    return nvrtc().compile(source, target, line_info)


# -- nvcc --------------------------------------------------------------------------------


def find_nvcc() -> Path:
    """The machine's nvcc (on PATH, else /usr/local/cuda/bin). Raises BackendUnavailable when
    there is none."""
    found = shutil.which("nvcc") or shutil.which("nvcc", path="/usr/local/cuda/bin")
    if found is None:
        raise BackendUnavailable("nvcc is not installed (the CUDA toolkit, or pip install 'cuda-toolkit[nvcc,cccl]')")
    return Path(found)


@functools.cache
def nvcc_version(nvcc: Path) -> str:
    """The compiler and its version from `nvcc --version`: "nvcc 13.0"."""
    output = subprocess.run([str(nvcc), "--version"], capture_output=True, text=True, check=True).stdout
    release = re.search(r"release (\d+\.\d+)", output)
    return f"nvcc {release[1] if release else '?'}"


def compile_nvcc(source: Path, arch: str) -> Compiled:
    """`source` compiled by nvcc to a cubin for `arch` ("sm_90") with every warning an error.
    Raises CompileError, with nvcc's output, when it does not compile."""
    nvcc = find_nvcc()
    source = source.resolve()  # nvcc runs in its own folder
    with tempfile.TemporaryDirectory(prefix="sprig-nvcc-") as work:
        cubin = Path(work) / f"{source.stem}.cubin"
        command = [
            str(nvcc), "-cubin", f"-arch={arch}", "-Xptxas", "-v", "-Werror", "all-warnings",
            *_COMMON_OPTIONS, f"-I{source.parent}", "-keep", "-keep-dir", work, "-o", str(cubin), str(source),
        ]  # fmt: skip
        run = subprocess.run(command, capture_output=True, text=True, cwd=work)
        log = run.stdout + run.stderr
        if run.returncode != 0:
            raise CompileError(f"{source.name} does not compile for {arch} (nvcc, warnings as errors):\n{log}")
        ptx = (Path(work) / f"{source.stem}.ptx").read_text()  # kept by -keep
        image = cubin.read_bytes()
    kernels = parse_ptxas_log(log, ptx_block_sizes(ptx))
    return Compiled(source, arch, nvcc_version(nvcc), image, ptx.encode() + b"\0", log, kernels)
