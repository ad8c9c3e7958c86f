"""Build the images users' GPUs load: `python -m backends.cuda.build_cubins [outdir]`.

Compiles every kernel file (`kernels/*.cu`) with NVRTC for each architecture of
`compiler.CUBIN_ARCHS`, keeping each cubin and the newest one's PTX (compute_120), into
`backends/cuda/cubins/` unless told another folder, with the manifest `modules.kernel_image` reads. A kernel file
whose sources, compiler and targets are those of its images already there is not compiled
again. `make install` runs it; without the NVRTC wheel (the `cuda-build` extra) it says so
and builds nothing. A file that does not compile stops the build; resource problems
(spills, a block over the register file) are printed as warnings, and the tests fail on them.
"""

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from backends.cuda.compiler import CUBIN_ARCHS, KERNELS_DIR, CompileError, nvrtc
from backends.cuda.modules import CUBIN_DIR, MANIFEST, arch_capability, read_manifest, source_digest
from backends.errors import BackendUnavailable


def image_name(module: str, target: str) -> str:
    """The file name of one image: products.sm_86.cubin, products.compute_120.ptx."""
    return f"{module}.{target}.{'ptx' if target.startswith('compute_') else 'cubin'}"


def build(
    outdir: Path = CUBIN_DIR,
    kernels_dir: Path = KERNELS_DIR,
    archs: Sequence[str] = CUBIN_ARCHS,
) -> list[str]:
    """Build every kernel file of `kernels_dir` for `archs` (cubins, and the newest's PTX)
    into `outdir` and write the manifest; return the problems found
    (`compiler.Compiled.problems`). Raises CompileError when a file does not compile,
    BackendUnavailable without NVRTC. Removes the other images in `outdir`."""
    compiler = nvrtc()
    newest = max(archs, key=arch_capability)
    ptx_target = newest.replace("sm_", "compute_")
    outdir.mkdir(parents=True, exist_ok=True)
    previous = read_manifest(outdir) or {}
    same_build = previous.get("compiler") == compiler.name
    modules: dict[str, Any] = {}
    problems: list[str] = []
    for source in sorted(kernels_dir.glob("*.cu")):
        module = source.stem
        images = {target: image_name(module, target) for target in (*archs, ptx_target)}
        entry = {"source_sha256": source_digest(module, kernels_dir), "images": images}
        old = previous.get("modules", {}).get(module)
        if same_build and old == entry and all((outdir / name).exists() for name in images.values()):
            modules[module] = entry
            continue
        for arch in archs:
            compiled = compiler.compile(source, arch)
            (outdir / image_name(module, arch)).write_bytes(compiled.image)
            if arch == newest:
                (outdir / image_name(module, ptx_target)).write_bytes(compiled.ptx)
            problems += compiled.problems()
        modules[module] = entry
    kept = {name for entry in modules.values() for name in entry["images"].values()}
    for leftover in [*outdir.glob("*.cubin"), *outdir.glob("*.ptx")]:
        if leftover.name not in kept:
            leftover.unlink()
    ptx_driver = compiler.version[0] * 1000 + compiler.version[1] * 10  # as cuDriverGetVersion reports it
    manifest = {"compiler": compiler.name, "ptx_driver": ptx_driver, "modules": modules}
    (outdir / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return problems


def main(argv: Sequence[str] = ()) -> int:
    """Build into argv[0] (default `backends/cuda/cubins/`); the exit status for the shell."""
    outdir = Path(argv[0]) if argv else CUBIN_DIR
    try:
        problems = build(outdir)
    except BackendUnavailable as missing:
        print(f"build_cubins: no CUDA images built: {missing}")
        return 0
    except CompileError as error:
        print(f"build_cubins: {error}", file=sys.stderr)
        return 1
    for problem in problems:
        print(f"build_cubins: warning: {problem}", file=sys.stderr)
    built = read_manifest(outdir) or {}
    print(f"build_cubins: {len(built.get('modules', {}))} kernel files built in {outdir}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
