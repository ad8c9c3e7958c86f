"""Before the window opens: are the system libraries of Qt's display plugin there?

On a fresh Linux desktop Qt's xcb plugin often lacks a library or two (libxcb-cursor0
most of all), and Qt then aborts with a long message that names no package. `sprig`
(and so `make run`) asks `ldd` which of the plugin's libraries cannot be found, and
prints the one `apt` or `dnf` line that installs them instead.

Only QtCore is imported here: it does not need the display libraries.
"""

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

# Shared library → (Debian/Ubuntu package, Fedora package), for what Qt's xcb and wayland
# plugins load that a minimal desktop install may lack.
PACKAGES: dict[str, tuple[str, str]] = {
    "libxcb-cursor.so.0": ("libxcb-cursor0", "xcb-util-cursor"),
    "libxcb-icccm.so.4": ("libxcb-icccm4", "xcb-util-wm"),
    "libxcb-keysyms.so.1": ("libxcb-keysyms1", "xcb-util-keysyms"),
    "libxcb-image.so.0": ("libxcb-image0", "xcb-util-image"),
    "libxcb-render-util.so.0": ("libxcb-render-util0", "xcb-util-renderutil"),
    "libxcb-util.so.1": ("libxcb-util1", "xcb-util"),
    "libxkbcommon-x11.so.0": ("libxkbcommon-x11-0", "libxkbcommon-x11"),
    "libxkbcommon.so.0": ("libxkbcommon0", "libxkbcommon"),
    "libxcb-randr.so.0": ("libxcb-randr0", "libxcb"),
    "libxcb-shape.so.0": ("libxcb-shape0", "libxcb"),
    "libxcb-shm.so.0": ("libxcb-shm0", "libxcb"),
    "libxcb-sync.so.1": ("libxcb-sync1", "libxcb"),
    "libxcb-xfixes.so.0": ("libxcb-xfixes0", "libxcb"),
    "libxcb-render.so.0": ("libxcb-render0", "libxcb"),
    "libxcb-xkb.so.1": ("libxcb-xkb1", "libxcb"),
    "libxcb.so.1": ("libxcb1", "libxcb"),
    "libX11-xcb.so.1": ("libx11-xcb1", "libX11-xcb"),
    "libX11.so.6": ("libx11-6", "libX11"),
    "libEGL.so.1": ("libegl1", "libglvnd-egl"),
    "libGL.so.1": ("libgl1", "libglvnd-glx"),
    "libOpenGL.so.0": ("libopengl0", "libglvnd-opengl"),
    "libfontconfig.so.1": ("libfontconfig1", "fontconfig"),
    "libfreetype.so.6": ("libfreetype6", "freetype"),
    "libdbus-1.so.3": ("libdbus-1-3", "dbus-libs"),
    "libglib-2.0.so.0": ("libglib2.0-0", "glib2"),
    "libwayland-client.so.0": ("libwayland-client0", "libwayland-client"),
    "libwayland-cursor.so.0": ("libwayland-cursor0", "libwayland-cursor"),
    "libwayland-egl.so.1": ("libwayland-egl1", "libwayland-egl"),
}

DISPLAY_PLATFORMS = ("xcb", "wayland")  # the plugins that need the desktop's libraries


@dataclass(frozen=True)
class MissingLibraries:
    """The libraries a platform plugin cannot find, and the command that installs them."""

    platform: str
    libraries: tuple[str, ...]
    command: str

    def message(self) -> str:
        """What `sprig` prints instead of Qt's abort."""
        return (
            f"Sprig cannot open its window: Qt's {self.platform} display plugin needs "
            f"{', '.join(self.libraries)}, which this system does not have. Install "
            f"{'it' if len(self.libraries) == 1 else 'them'} with:\n\n    {self.command}\n"
        )


def platforms_to_try(environ: dict[str, str]) -> list[str]:
    """The display plugins Qt will try, in order: QT_QPA_PLATFORM's, else the session's.

    Empty when Qt will not need the desktop's libraries (offscreen, minimal, vnc, eglfs…).
    """
    requested = environ.get("QT_QPA_PLATFORM", "")
    if requested:
        names = [name.split(":")[0].strip() for name in requested.split(";")]
        return names if all(name in DISPLAY_PLATFORMS for name in names) else []
    return ["wayland", "xcb"] if environ.get("XDG_SESSION_TYPE") == "wayland" else ["xcb"]


def unresolved_libraries(binary: Path) -> list[str]:
    """The shared libraries `binary` needs (directly or not) that the dynamic loader cannot find.

    Asks `ldd`; without it (not glibc), nothing is reported, and Qt says what it says.
    """
    ldd = shutil.which("ldd")
    if ldd is None:
        return []
    result = subprocess.run([ldd, str(binary)], capture_output=True, text=True, check=False)
    missing: list[str] = []
    for line in result.stdout.splitlines():
        name, _, where = line.strip().partition(" => ")
        if where.strip() == "not found" and name not in missing:
            missing.append(name)
    return missing


def package_manager(os_release: str) -> str:
    """ "apt" or "dnf" for the distribution described by /etc/os-release's text ("apt" if unknown)."""
    fields = {}
    for line in os_release.splitlines():
        key, _, value = line.partition("=")
        fields[key.strip()] = value.strip().strip('"')
    family = f"{fields.get('ID', '')} {fields.get('ID_LIKE', '')}".split()
    return "dnf" if any(name in ("fedora", "rhel", "centos") for name in family) else "apt"


def install_command(libraries: list[str], manager: str) -> str:
    """The one command that installs `libraries` with `manager` ("apt" or "dnf").

    A library not in PACKAGES is named by its file, for the user to look up.
    """
    column = 1 if manager == "dnf" else 0
    packages: list[str] = []
    for library in libraries:
        package = PACKAGES[library][column] if library in PACKAGES else library
        if package not in packages:
            packages.append(package)
    prefix = "sudo dnf install" if manager == "dnf" else "sudo apt-get install"
    return f"{prefix} {' '.join(packages)}"


def platform_folders(environ: dict[str, str], plugins_folder: Path) -> list[Path]:
    """The folders Qt looks for platform plugins in, in its order.

    QT_QPA_PLATFORM_PLUGIN_PATH, then each QT_PLUGIN_PATH entry's platforms/, then Qt's own.
    """
    folders = [Path(environ["QT_QPA_PLATFORM_PLUGIN_PATH"])] if environ.get("QT_QPA_PLATFORM_PLUGIN_PATH") else []
    folders += [Path(entry) / "platforms" for entry in environ.get("QT_PLUGIN_PATH", "").split(os.pathsep) if entry]
    return [*folders, plugins_folder / "platforms"]


def plugin_file(folders: list[Path], platform: str) -> Path | None:
    """The shared library of Qt's `platform` plugin: the first in `folders` (None: there is none)."""
    candidates = (folder / f"libq{platform}.so" for folder in folders)
    return next((candidate for candidate in candidates if candidate.is_file()), None)


def missing_display_libraries(
    plugins_folder: Path, environ: dict[str, str], os_release: str
) -> MissingLibraries | None:
    """What the first display plugin Qt will try lacks, unless one of them has everything.

    None where Qt needs no display plugin, or where it has no plugin file to check.
    """
    folders = platform_folders(environ, plugins_folder)
    first: MissingLibraries | None = None
    for platform in platforms_to_try(environ):
        plugin = plugin_file(folders, platform)
        missing = unresolved_libraries(plugin) if plugin else []
        if not missing:
            return None
        if first is None:
            first = MissingLibraries(platform, tuple(missing), install_command(missing, package_manager(os_release)))
    return first


def check_display_libraries() -> MissingLibraries | None:
    """This process's check: Linux only, with Qt's own plugin folder and /etc/os-release."""
    if not sys.platform.startswith("linux"):
        return None
    from PySide6.QtCore import QLibraryInfo

    plugins = Path(QLibraryInfo.path(QLibraryInfo.LibraryPath.PluginsPath))
    try:
        os_release = Path("/etc/os-release").read_text(encoding="utf-8")
    except OSError:
        os_release = ""
    return missing_display_libraries(plugins, dict(os.environ), os_release)
