"""Screenshots of the real window in its main states, for docs/screenshots/ and the README.

    xvfb-run -s "-screen 0 1366x768x24" sh -c 'openbox & .venv/bin/python tools/checks/take_screenshots.py \
        docs/screenshots --suffix=-1366x768'

`make screenshot` runs it under a window manager (openbox) on a 1920×1080 screen (the
files without a suffix) and on a 1366×768 one. It opens the real MainWindow on the bundled
default model at the size it picks for itself, with its chats and settings in a temporary
folder, and drives it through: empty, streaming, a finished answer with code, the model
picker, the settings, an error, the dark theme, and a base model's completion view. Each state is saved as a PNG of the
screen's pixels under the window (or dialog), its title bar included, and the script
fails if the window's frame does not fit the screen.
"""

import argparse
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
from engine.bundled import bundled_model, default_model

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
    """Save the screen's pixels under `widget`'s frame (title bar and all) as they are now."""
    settle()
    path = folder / f"{name}.png"
    frame, screen = widget.frameGeometry(), widget.screen()
    if not screen.availableGeometry().contains(frame):
        raise SystemExit(f"{name}: the frame {frame} does not fit the screen's free area {screen.availableGeometry()}")
    screen.grabWindow(0, frame.x(), frame.y(), frame.width(), frame.height()).save(str(path))
    print(f"wrote {path}")


def main(folder: Path, suffix: str) -> int:
    """Drive the window through its states and save each one as folder/<state><suffix>.png."""
    folder.mkdir(parents=True, exist_ok=True)
    app = QApplication(sys.argv[:1])
    data = Path(tempfile.mkdtemp(prefix="sprig-screenshots-"))
    settings = replace(Settings.defaults(), temperature=0.0, max_tokens=160, models_folder=data / "models")
    apply_theme(app, settings.theme)
    store = Store(data / "sprig.sqlite3")
    window = MainWindow(store, settings, data / "settings.json")
    window.show()
    controller = window.controller

    window.add_model(str(default_model().path))
    wait_until(lambda: controller.model_info is not None and not controller.busy)
    shoot(window, folder, "1-empty" + suffix)

    streamed = [""]
    controller.answer_text.connect(lambda text: streamed.__setitem__(0, text))
    controller.send("What is the capital of France, and what is it famous for?")
    wait_until(lambda: len(streamed[0]) > 80)
    shoot(window, folder, "2-streaming" + suffix)
    wait_until(lambda: not controller.busy)

    controller.send(CODE_QUESTION)
    wait_until(lambda: not controller.busy)
    shoot(window, folder, "3-answer-with-code" + suffix)

    picker = window.open_model_picker()
    picker.wait_for_headers()
    shoot(picker, folder, "4-model-picker" + suffix)
    picker.close()

    from app.widgets.settings_dialog import SettingsDialog
    dialog = SettingsDialog(controller.settings, list(controller.loaded.backend_notes), window)
    dialog.show()
    shoot(dialog, folder, "5-settings" + suffix)
    dialog.close()

    model_settings = window.open_model_settings()
    assert model_settings is not None  # a model is loaded
    wait_until(lambda: model_settings.draft.count() > 1 and "reading" not in model_settings.draft.itemText(1))
    shoot(model_settings, folder, "9-model-settings" + suffix)
    model_settings.close()

    window.local_server.set_running(True)
    server_settings = window.open_server_settings()
    server_settings.network.setChecked(True)  # no key yet: the refusal shows
    shoot(window, folder, "10-server" + suffix)
    server_settings.close()
    window.local_server.set_running(False)

    broken = data / "broken.gguf"
    broken.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\xff" * 64)
    window.add_model(str(broken))
    wait_until(lambda: window.error_banner.isVisible() and not controller.busy)
    shoot(window, folder, "6-error" + suffix)

    window.error_banner.hide()
    window.apply_settings(replace(controller.settings, theme="dark"))
    shoot(window, folder, "7-dark" + suffix)
    window.apply_settings(replace(controller.settings, theme=settings.theme))

    window.add_model(str(bundled_model("gemma3").path))  # a base model: the completion view
    wait_until(lambda: controller.model_info is not None and controller.model_info.base_model and not controller.busy)
    window.completion.editor.setPlainText("The three most useful tools in a small kitchen are")
    window.completion.run_button.click()
    wait_until(lambda: not controller.busy)
    shoot(window, folder, "11-completion" + suffix)

    QTimer.singleShot(0, window.close)
    window.close()
    store.close()
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", nargs="?", type=Path, default=Path("docs/screenshots"))
    parser.add_argument("--suffix", default="", help="added to every file name, e.g. -1366x768")
    args = parser.parse_args()
    sys.exit(main(args.folder, args.suffix))
