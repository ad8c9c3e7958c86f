"""Fixtures for the packaging tests: one `make package` per test run, and the tools it needs.

Every test here skips, saying which Debian package to install, where a tool is missing
(`make package-deps` installs them all, as .ci/run does). The build is shared by the
whole session: it takes minutes.
"""

import os
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LINUX = REPO / "packaging" / "linux"
BUILD_TOOLS = {
    "fakeroot": "fakeroot",
    "dpkg-deb": "dpkg-dev",
    "objdump": "binutils",
    "xz": "xz-utils",
    "strip": "binutils",
}


def require_tools(tools: dict[str, str]) -> None:
    """Skip unless every command in `tools` (command -> Debian package) is on PATH."""
    missing = sorted({package for command, package in tools.items() if shutil.which(command) is None})
    if missing:
        pytest.skip(
            f"needs Debian's {', '.join(missing)}: apt-get install {' '.join(missing)} (or `make package-deps`)"
        )


@dataclass(frozen=True)
class Package:
    """What `make package` built."""

    bundle: Path  # dist/sprig/
    deb: Path
    tarball: Path
    version: str


@pytest.fixture(scope="session")
def package() -> Package:
    """Run `make package` once, with the interpreter running the tests, and return its outputs."""
    if not sys.platform.startswith("linux"):
        pytest.skip("the .deb and .tar.xz are built on Linux")
    require_tools(BUILD_TOOLS)
    try:
        import PyInstaller  # noqa: F401
    except ImportError:
        pytest.skip("needs PyInstaller: pip install -e '.[dev]'")
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    result = subprocess.run(
        ["make", "--no-print-directory", "package", f"BIN={Path(sys.executable).parent}", "NATIVE_STAMP="],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=3600,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    arch = subprocess.run(["dpkg", "--print-architecture"], capture_output=True, text=True).stdout.strip()
    return Package(
        REPO / "dist" / "sprig",
        REPO / "dist" / f"sprig_{version}_{arch}.deb",
        REPO / "dist" / f"sprig-{version}-linux-{os.uname().machine}.tar.xz",
        version,
    )
