"""`sprig` names the package of a display library Qt's plugin lacks, instead of letting Qt abort.

A real ELF "plugin" is built with gcc, linked against a stub library that is then
deleted, so `ldd` reports it missing exactly as it does on a fresh desktop."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from app.qt_libraries import install_command, missing_display_libraries, package_manager, platforms_to_try

MISSING = "libsprig-gone.so.1"
DEBIAN = 'PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\nID=debian\n'
FEDORA = 'NAME="Fedora Linux"\nID=fedora\n'
UBUNTU = "ID=ubuntu\nID_LIKE=debian\n"

needs_gcc = pytest.mark.skipif(
    shutil.which("gcc") is None or shutil.which("ldd") is None or not sys.platform.startswith("linux"),
    reason="needs gcc and ldd (apt-get install gcc)",
)


def build_plugin(folder: Path, platform: str = "xcb") -> Path:
    """folder/platforms/libq<platform>.so, needing MISSING, which no longer exists."""
    stub_dir = folder / "stub"
    stub_dir.mkdir(parents=True)
    (stub_dir / "stub.c").write_text("int sprig_stub(void) { return 1; }\n")
    (folder / "plugin.c").write_text("int sprig_stub(void);\nint plugin(void) { return sprig_stub(); }\n")
    stub = stub_dir / MISSING
    subprocess.run(["gcc", "-shared", "-fPIC", f"-Wl,-soname,{MISSING}", "-o", stub, stub_dir / "stub.c"], check=True)
    platforms = folder / "platforms"
    platforms.mkdir()
    plugin = platforms / f"libq{platform}.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", plugin, folder / "plugin.c", stub], check=True)
    shutil.rmtree(stub_dir)
    return plugin


@needs_gcc
def test_a_missing_library_of_the_xcb_plugin_is_named_with_its_install_line(tmp_path):
    build_plugin(tmp_path)
    missing = missing_display_libraries(tmp_path, {"QT_QPA_PLATFORM": "xcb"}, DEBIAN)
    assert missing is not None
    assert missing.libraries == (MISSING,)
    assert missing.command == f"sudo apt-get install {MISSING}"  # unknown to the table: named by its file
    assert missing.command in missing.message() and "xcb" in missing.message()


@needs_gcc
def test_a_complete_plugin_or_an_offscreen_run_reports_nothing(tmp_path):
    build_plugin(tmp_path)
    assert missing_display_libraries(tmp_path, {"QT_QPA_PLATFORM": "offscreen"}, DEBIAN) is None
    wayland = tmp_path / "platforms" / "libqwayland.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", wayland, "-x", "c", "-"], input=b"int p(void){return 0;}", check=True)
    # On a Wayland session Qt tries wayland first: complete, so xcb's gap does not matter.
    assert missing_display_libraries(tmp_path, {"XDG_SESSION_TYPE": "wayland"}, DEBIAN) is None
    assert missing_display_libraries(tmp_path, {"XDG_SESSION_TYPE": "x11"}, DEBIAN) is not None


@needs_gcc
def test_sprig_prints_the_line_and_exits_instead_of_qt_aborting(tmp_path):
    build_plugin(tmp_path / "plugins")
    env = {**os.environ, "QT_QPA_PLATFORM": "xcb", "QT_PLUGIN_PATH": str(tmp_path / "plugins")}
    result = subprocess.run(
        [sys.executable, "-m", "app", "--data-dir", str(tmp_path / "data")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert result.returncode == 2
    assert f"install {MISSING}" in result.stderr
    assert "Aborted" not in result.stderr and "could not load the Qt platform plugin" not in result.stderr.lower()


def test_the_install_line_follows_the_distribution():
    libraries = ["libxcb-cursor.so.0", "libxcb-icccm.so.4", "libxcb-shape.so.0", "libxcb-xkb.so.1"]
    assert package_manager(DEBIAN) == package_manager(UBUNTU) == "apt"
    assert package_manager(FEDORA) == "dnf"
    assert install_command(libraries, "apt") == (
        "sudo apt-get install libxcb-cursor0 libxcb-icccm4 libxcb-shape0 libxcb-xkb1"
    )
    assert install_command(libraries, "dnf") == "sudo dnf install xcb-util-cursor xcb-util-wm libxcb"  # once each


def test_which_plugins_qt_will_try():
    assert platforms_to_try({}) == ["xcb"]
    assert platforms_to_try({"XDG_SESSION_TYPE": "wayland"}) == ["wayland", "xcb"]
    assert platforms_to_try({"QT_QPA_PLATFORM": "wayland;xcb"}) == ["wayland", "xcb"]
    assert platforms_to_try({"QT_QPA_PLATFORM": "offscreen"}) == []
