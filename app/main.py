"""Entry point of the `sprig` console script.

The chat window is not built yet (it is the desktop-app issue). Until then this opens a
placeholder window that names the bundled default model it will chat with.
"""

import sys

from PySide6.QtWidgets import QApplication, QLabel, QMainWindow

from engine.bundled import default_model


def build_window() -> QMainWindow:
    """Build the placeholder main window."""
    window = QMainWindow()
    window.setWindowTitle("Sprig")
    model = default_model()
    label = QLabel(
        f"Sprig — the chat window is not built yet.\n\nDefault model: {model.name}\n{model.path}"
    )
    label.setMargin(24)
    window.setCentralWidget(label)
    window.resize(720, 360)
    return window


def main(argv: list[str] | None = None) -> int:
    """Open the window and run the Qt event loop."""
    app = QApplication(sys.argv if argv is None else argv)
    window = build_window()
    window.show()
    return app.exec()


if __name__ == "__main__":
    sys.exit(main())
