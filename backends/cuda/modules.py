"""Which compiled image of a kernel file a GPU loads.

`python -m backends.cuda.build_cubins` (run by `make install`) leaves in `cubins/` one cubin
per architecture of `compiler.CUBIN_ARCHS`, the PTX of the newest, and a manifest:

    {"compiler": "NVRTC 12.9", "ptx_driver": 12090,
     "modules": {"products": {"source_sha256": "…",
                              "images": {"sm_61": "products.sm_61.cubin", …,
                                         "compute_120": "products.compute_120.ptx"}}}}

`ptx_driver` is the CUDA version (as `cuDriverGetVersion` reports it) that a driver needs to
JIT-compile the PTX. `source_sha256` covers the kernel file and the shared headers beside it,
so images built from older sources are noticed and not loaded.
"""

import hashlib
import json
from pathlib import Path
from typing import Any

from backends.cuda.compiler import KERNELS_DIR, CompileError, compile_nvrtc
from backends.errors import BackendUnavailable

CUBIN_DIR = Path(__file__).resolve().parent / "cubins"
MANIFEST = "manifest.json"

# The first drivers of a CUDA release, by the version cuDriverGetVersion reports, for messages.
_DRIVERS = {12090: "575.51.03 on Linux, 576.02 on Windows"}


def source_digest(module: str, kernels_dir: Path = KERNELS_DIR) -> str:
    """SHA-256 over kernel file `module`.cu and every shared header (*.cuh) beside it."""
    digest = hashlib.sha256()
    for path in [kernels_dir / f"{module}.cu", *sorted(kernels_dir.glob("*.cuh"))]:
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def read_manifest(cubin_dir: Path = CUBIN_DIR) -> dict[str, Any] | None:
    """The manifest of the images in `cubin_dir`, or None when none was built there."""
    path = cubin_dir / MANIFEST
    return json.loads(path.read_text()) if path.exists() else None


def stale_modules(cubin_dir: Path = CUBIN_DIR, kernels_dir: Path = KERNELS_DIR) -> list[str]:
    """Kernel files whose images in `cubin_dir` are missing or were built from other sources."""
    built = (read_manifest(cubin_dir) or {}).get("modules", {})
    return [
        source.stem
        for source in sorted(kernels_dir.glob("*.cu"))
        if built.get(source.stem, {}).get("source_sha256") != source_digest(source.stem, kernels_dir)
    ]


def arch_capability(target: str) -> tuple[int, int]:
    """The compute capability of "sm_86" or "compute_120": (8, 6), (12, 0)."""
    number = int(target.split("_")[1])
    return number // 10, number % 10


def pick_cubin(targets: list[str], capability: tuple[int, int]) -> str | None:
    """The cubin target that runs on a device of `capability`: the same major version and the
    highest minor not above the device's (an sm_86 cubin runs on 8.9, never on 9.0)."""
    fitting = [
        t
        for t in targets
        if t.startswith("sm_") and arch_capability(t)[0] == capability[0] and arch_capability(t) <= capability
    ]
    return max(fitting, key=arch_capability, default=None)


def _cuda_version(driver_version: int) -> str:
    """12090 → "12.9"."""
    return f"{driver_version // 1000}.{driver_version % 1000 // 10}"


def kernel_image(
    module: str,
    capability: tuple[int, int],
    driver_version: int,
    cubin_dir: Path = CUBIN_DIR,
    kernels_dir: Path = KERNELS_DIR,
) -> tuple[bytes, str]:
    """The image of kernel file `module` for a device of compute `capability` under a driver
    of `driver_version` (cuDriverGetVersion: 12090 is CUDA 12.9), and where it came from.

    In order: the prebuilt cubin for the device (`pick_cubin`); else the prebuilt PTX, when
    the device is at least its architecture and the driver can JIT it; else the kernel file
    compiled here by NVRTC (development). Images built from sources other than the ones in
    `kernels_dir` are passed over (where the sources are absent, as in the packaged app, the
    manifest is trusted). Raises BackendUnavailable saying why each way failed.
    """
    sm = f"sm_{capability[0]}{capability[1]}"
    reasons = []
    manifest = read_manifest(cubin_dir)
    entry = (manifest or {}).get("modules", {}).get(module)
    source = kernels_dir / f"{module}.cu"
    if entry is None:
        reasons.append(f"no prebuilt images of {module} in {cubin_dir}")
    elif source.exists() and entry["source_sha256"] != source_digest(module, kernels_dir):
        reasons.append(f"the prebuilt images of {module} are stale, built from older sources (run `make install`)")
        entry = None
    if manifest is not None and entry is not None:
        images: dict[str, str] = entry["images"]
        cubin = pick_cubin(list(images), capability)
        if cubin is not None:
            return (cubin_dir / images[cubin]).read_bytes(), images[cubin]
        ptx = next((t for t in images if t.startswith("compute_") and arch_capability(t) <= capability), None)
        if ptx is None:
            reasons.append(f"no cubin of {module} for {sm} (built: {', '.join(sorted(images))})")
        elif driver_version < manifest["ptx_driver"]:
            needed = manifest["ptx_driver"]
            first = f" ({_DRIVERS[needed]})" if needed in _DRIVERS else ""
            reasons.append(
                f"no cubin of {module} for {sm}, and its PTX needs a driver for CUDA {_cuda_version(needed)} or "
                f"newer{first}; this driver supports CUDA {_cuda_version(driver_version)}: update the NVIDIA driver"
            )
        else:
            return (cubin_dir / images[ptx]).read_bytes(), images[ptx]
    if not source.exists():
        reasons.append(f"its source {source} is not here to compile")
    else:
        try:
            compiled = compile_nvrtc(source, sm, line_info=True)  # development: the tools can name lines
        except (BackendUnavailable, CompileError) as error:
            reasons.append(str(error))
        else:
            return compiled.image, f"{source.name} compiled by {compiled.compiler} for {sm}"
    raise BackendUnavailable(
        f"cuda: no image of kernel file {module} for this GPU (compute capability {capability[0]}.{capability[1]}): "
        + "; ".join(reasons)
    )
