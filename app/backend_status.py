"""What the window says about the backend in use: information, or a warning when a GPU idles.

A PC without a GPU running on the CPU is normal, so the reasons the other backends were
passed over are details for a tooltip. Only a GPU that is present but not used is a
warning, because that is a setup the user can fix.
"""

import platform
from dataclasses import dataclass
from pathlib import Path

CPU_BACKENDS = ("cpu", "numpy")  # the native C kernels and the NumPy reference both run on the CPU
_NVIDIA_SIGNS = ("/proc/driver/nvidia/version", "/dev/nvidia0", "/dev/nvidiactl")


def gpu_present() -> str | None:
    """A description of a GPU Sprig could use on this machine, or None when there is none."""
    if platform.system() == "Darwin" and platform.machine() == "arm64":
        return "an Apple silicon GPU"
    if any(Path(sign).exists() for sign in _NVIDIA_SIGNS):
        return "an NVIDIA GPU"
    return None


@dataclass(frozen=True)
class BackendStatus:
    """`summary`: one line for the window; `short`: the same without the device's particulars
    (for the top bar); `details`: every backend's story, for a tooltip; `warning`: set only
    when a GPU is present but unused."""

    summary: str
    short: str
    details: str
    warning: str | None


def backend_status(name: str, device: str, reasons: list[str], gpu: str | None = None) -> BackendStatus:
    """Describe backend `name` on `device`, given why the others were passed over.

    `gpu` is what `gpu_present()` found (pass it in; it is read once per window).
    """
    details = f"Running on the {name} backend ({device})."
    if reasons:
        details += "\nWhy not the others:\n" + "\n".join(f"• {reason}" for reason in reasons)
    warning = None
    if gpu and name in CPU_BACKENDS:
        why = "; ".join(r for r in reasons if r.split(":", 1)[0] in ("cuda", "mlx")) or "no GPU backend started"
        warning = f"This computer has {gpu}, but Sprig runs on the CPU: {why}."
        details = f"{warning}\n\n{details}"
    return BackendStatus(f"{name} · {device}", f"{name} · {device.split(' (', 1)[0]}", details, warning)
