"""Screenshots of the real window in its main states, for docs/screenshots/ and the README.

    xvfb-run -s "-screen 0 1600x1000x24" .venv/bin/python tools/take_screenshots.py docs/screenshots

(`make screenshot` runs exactly that.) It opens the real MainWindow on the bundled default
model, with its chats and settings in a temporary folder, and drives it through: empty,
streaming, a finished answer with code (also at the laptop sizes 1366×768 and 1280×720),
the model picker, the settings, an error, and the
dark theme. Each state is saved as a PNG of the window (or dialog) as it is on screen.
"""

import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication, QWidget

from app.main_window import MainWindow
from app.settings import Settings
from app.storage import Store
from app.theme import apply_theme
from engine.bundled import default_model

DESKTOP_SIZE = (1440, 900)
LAPTOP_SIZES = ((1366, 768), (1280, 720))  # the answer with code is also shot at these sizes
CODE_QUESTION = "Write a Python function that reverses a string, in a code block."


def wait_until(condition, timeout: float = 300.0) -> None:
    """Run the event loop until `condition()` holds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("the window did not reach the expected state")
        QApplication.processEvents()
        time.sleep(0.01)


def settle(seconds: float = 0.3) -> None:
    """Let layouts and repaints finish."""
    wait_until(lambda: True)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        QApplication.processEvents()
        time.sleep(0.01)


def shoot(widget: QWidget, folder: Path, name: str) -> None:
    """Save `widget` as it looks now."""
    settle()
    path = folder / f"{name}.png"
    widget.grab().save(str(path))
    print(f"wrote {path}")


def main(folder: Path) -> int:
    """Drive the window through its states and save each one."""
    folder.mkdir(parents=True, exist_ok=True)
    app = QApplication(sys.argv[:1])
    data = Path(tempfile.mkdtemp(prefix="sprig-screenshots-"))
    settings = replace(Settings.defaults(), temperature=0.0, max_tokens=160, models_folder=data / "models")
    apply_theme(app, settings.theme)
    store = Store(data / "sprig.sqlite3")
    window = MainWindow(store, settings, data / "settings.json")
    window.resize(*DESKTOP_SIZE)
    window.show()
    controller = window.controller

    window.add_model(str(default_model().path))
    wait_until(lambda: controller.model_info is not None and not controller.busy)
    shoot(window, folder, "1-empty")

    streamed = [""]
    controller.answer_text.connect(lambda text: streamed.__setitem__(0, text))
    controller.send("What is the capital of France, and what is it famous for?")
    wait_until(lambda: len(streamed[0]) > 80)
    shoot(window, folder, "2-streaming")
    wait_until(lambda: not controller.busy)

    controller.send(CODE_QUESTION)
    wait_until(lambda: not controller.busy)
    shoot(window, folder, "3-answer-with-code")
    for width, height in LAPTOP_SIZES:
        window.resize(width, height)
        shoot(window, folder, f"3-answer-with-code-{width}x{height}")
    window.resize(*DESKTOP_SIZE)

    picker = window.open_model_picker()
    picker.wait_for_headers()
    shoot(picker, folder, "4-model-picker")
    picker.close()

    from app.widgets.settings_dialog import SettingsDialog
    dialog = SettingsDialog(controller.settings, list(controller.loaded.backend_notes), window)
    dialog.show()
    shoot(dialog, folder, "5-settings")
    dialog.close()

    broken = data / "broken.gguf"
    broken.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\xff" * 64)
    window.add_model(str(broken))
    wait_until(lambda: window.error_banner.isVisible() and not controller.busy)
    shoot(window, folder, "6-error")

    window.error_banner.hide()
    window.apply_settings(replace(controller.settings, theme="dark"))
    shoot(window, folder, "7-dark")
    window.resize(*LAPTOP_SIZES[0])
    shoot(window, folder, "7-dark-{}x{}".format(*LAPTOP_SIZES[0]))

    QTimer.singleShot(0, window.close)
    window.close()
    store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("docs/screenshots")))
