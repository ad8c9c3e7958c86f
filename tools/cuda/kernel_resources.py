"""What each CUDA kernel costs on each architecture users get a cubin for, as ptxas reports
it under NVRTC: registers, spills and static shared memory, written to docs/cuda-kernels.md.

    .venv/bin/python -m tools.cuda.kernel_resources            # rewrite docs/cuda-kernels.md
    .venv/bin/python -m tools.cuda.kernel_resources --stdout   # print it instead

Needs the NVRTC wheel (`make install` installs the `cuda-build` extra). Compiles every
kernel file once per architecture: a few minutes on two cores.
"""

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from backends.cuda.compiler import (
    CUBIN_ARCHS,
    KERNELS_DIR,
    REGISTER_FILE,
    STATIC_SHARED_LIMIT,
    Compiled,
    CompileError,
    compile_nvrtc,
    nvrtc,
)

DOC = Path(__file__).resolve().parents[2] / "docs" / "cuda-kernels.md"


def module_table(compiled: Sequence[Compiled]) -> list[str]:
    """The Markdown table of one kernel file compiled for each architecture: a row a kernel,
    its registers per architecture, its static shared memory, stack frame and any spills."""
    archs = [c.target for c in compiled]
    by_arch = [{k.name: k for k in c.kernels} for c in compiled]
    lines = [
        "| kernel | threads | "
        + " | ".join(archs)
        + " | shared (bytes) | stack (bytes) | spills (stored/loaded bytes) |",
        "|---|---:|" + "---:|" * len(archs) + "---:|---:|---|",
    ]
    for name in sorted(by_arch[0]):
        kernels = [kernels[name] for kernels in by_arch]
        threads = kernels[0].max_threads or "—"
        registers = " | ".join(str(k.registers) for k in kernels)
        shared = "/".join(sorted({str(k.shared) for k in kernels}, key=int))
        stack = "/".join(sorted({str(k.stack) for k in kernels}, key=int))
        spills = ", ".join(
            f"{arch} {k.spill_stores}/{k.spill_loads}"
            for arch, k in zip(archs, kernels, strict=True)
            if k.spill_stores or k.spill_loads
        )
        lines.append(f"| `{name}` | {threads} | {registers} | {shared} | {stack} | {spills or 'none'} |")
    return lines


def document(kernel_files: Sequence[Path], archs: Sequence[str] = CUBIN_ARCHS) -> str:
    """docs/cuda-kernels.md for `kernel_files` compiled for `archs`."""
    lines = [
        "# CUDA kernels: registers, shared memory, spills",
        "",
        "Written by `tools/cuda/kernel_resources.py` from ptxas's report (`--ptxas-options=-v`) under",
        f"{nvrtc().name}, for each architecture users get a cubin for; do not edit by hand.",
        "Registers are per thread; *threads* is the kernel's `__launch_bounds__` block size.",
        "`tests/backends/cuda/test_kernels_compile.py` fails on any spill, on a block whose registers",
        f"exceed the {REGISTER_FILE}-register file, and on more than {STATIC_SHARED_LIMIT} bytes of static",
        "shared memory; it also builds every file with nvcc 13, warnings as errors.",
    ]
    problems = []
    for source in kernel_files:
        lines += ["", f"## {source.name}", ""]
        try:
            compiled = [compile_nvrtc(source, arch) for arch in archs]
        except CompileError as error:
            lines.append("Does not compile:")
            lines += ["", "```", str(error).strip(), "```"]
            continue
        problems += [p for c in compiled for p in c.problems()]
        lines += module_table(compiled)
    if problems:
        lines += ["", "## Problems", "", *(f"- {p}" for p in problems)]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """Write (or print) the document; the exit status for the shell."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stdout", action="store_true", help="print the document instead of writing it")
    args = parser.parse_args(argv)
    text = document(sorted(KERNELS_DIR.glob("*.cu")))
    if args.stdout:
        sys.stdout.write(text)
    else:
        DOC.write_text(text)
        print(f"wrote {DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
