"""The real window on a real X server with a window manager (run by test_window_geometry.py).

    python tests/app/window_frame_driver.py DATA_DIR

Opens the MainWindow (no model: only its size matters), lets the window manager decorate
it, and prints one line of JSON: the screen's free area, the frame's rectangle, and the
Send button's and the sidebar's Import button's rectangles on the screen.
"""

import json
import sys
import time
from pathlib import Path

from PySide6.QtCore import QPoint, QRect
from PySide6.QtWidgets import QApplication, QWidget

from app.main_window import MainWindow
from app.settings import Settings
from app.storage import Store


def on_screen(widget: QWidget) -> list[int]:
    """`widget`'s rectangle in screen coordinates, as [x, y, width, height]."""
    corner = widget.mapToGlobal(QPoint(0, 0))
    return [corner.x(), corner.y(), widget.width(), widget.height()]


def as_list(rect: QRect) -> list[int]:
    """A QRect as [x, y, width, height]."""
    return [rect.x(), rect.y(), rect.width(), rect.height()]


def main(data: Path) -> int:
    """Show the window for two seconds and report where it is."""
    app = QApplication(sys.argv[:1])
    store = Store(data / "sprig.sqlite3")
    window = MainWindow(store, Settings.defaults(), data / "settings.json")
    window.show()
    end = time.monotonic() + 2.0
    while time.monotonic() < end:
        app.processEvents()
        time.sleep(0.02)
    print(json.dumps({
        "available": as_list(window.screen().availableGeometry()),
        "frame": as_list(window.frameGeometry()),
        "client": as_list(window.geometry()),
        "send": on_screen(window.send_button),
        "import": on_screen(window.sidebar.import_button),
    }))
    window.close()
    store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
