"""The NEON kernels, on an x86-64 machine: built for arm64 and run under qemu-user, they print
the same bits as the portable C kernels on the same inputs (tools/checks/neon_check/)."""

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOOLS = ("gcc", "aarch64-linux-gnu-gcc", "qemu-aarch64")


@pytest.mark.skipif(not all(shutil.which(tool) for tool in TOOLS),
                    reason="needs Debian's gcc-aarch64-linux-gnu and qemu-user (.ci/run installs them)")
def test_neon_kernels_match_the_portable_ones_bit_for_bit():
    result = subprocess.run([str(ROOT / "tools/checks/neon_check/run.sh")], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "agree bit for bit" in result.stdout
