"""Render resources/sprig.svg into the icon files each installer needs, with Qt's SVG renderer.

    python packaging/render_icons.py OUT_DIR [--iconset]

Always writes OUT_DIR/hicolor/<N>x<N>/apps/org.sprig.Sprig.png for the freedesktop hicolor
sizes (and scalable/apps/org.sprig.Sprig.svg). `--iconset` adds OUT_DIR/Sprig.iconset/ for
macOS's `iconutil -c icns`. (Windows' .ico is made from the PNGs by Pillow in
packaging/windows/build.ps1: Qt's ICO writer puts one image in a file, not several.)
"""

import argparse
import os
import shutil
import sys
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from PySide6.QtCore import Qt
from PySide6.QtGui import QGuiApplication, QImage, QPainter
from PySide6.QtSvg import QSvgRenderer

SVG = Path(__file__).resolve().parents[1] / "resources" / "sprig.svg"
ICON_NAME = "org.sprig.Sprig"
HICOLOR_SIZES = (16, 22, 24, 32, 48, 64, 128, 256, 512)
ICONSET = {
    f"icon_{n}x{n}{suffix}.png": n * scale for n in (16, 32, 128, 256, 512) for suffix, scale in (("", 1), ("@2x", 2))
}


def render(renderer: QSvgRenderer, size: int) -> QImage:
    """The SVG drawn on a transparent square of `size` pixels."""
    image = QImage(size, size, QImage.Format.Format_ARGB32_Premultiplied)
    image.fill(Qt.GlobalColor.transparent)
    painter = QPainter(image)
    painter.setRenderHint(QPainter.RenderHint.Antialiasing)
    renderer.render(painter)
    painter.end()
    return image


def save(image: QImage, path: Path, fmt: str = "PNG") -> None:
    """Write `image`, raising if Qt could not."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if not image.save(str(path), fmt):
        raise SystemExit(f"render_icons: could not write {path}")


def main(argv: list[str]) -> int:
    """Render the icons asked for into the folder given."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--iconset", action="store_true", help="also write Sprig.iconset/ (macOS)")
    args = parser.parse_args(argv)
    app = QGuiApplication.instance() or QGuiApplication(["render_icons"])  # noqa: F841 (painting needs it)
    renderer = QSvgRenderer(str(SVG))
    if not renderer.isValid():
        raise SystemExit(f"render_icons: {SVG} is not a valid SVG")
    hicolor = args.out / "hicolor"
    for size in HICOLOR_SIZES:
        save(render(renderer, size), hicolor / f"{size}x{size}" / "apps" / f"{ICON_NAME}.png")
    (hicolor / "scalable" / "apps").mkdir(parents=True, exist_ok=True)
    shutil.copyfile(SVG, hicolor / "scalable" / "apps" / f"{ICON_NAME}.svg")
    if args.iconset:
        for name, pixels in ICONSET.items():
            save(render(renderer, pixels), args.out / "Sprig.iconset" / name)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
