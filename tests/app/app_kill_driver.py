"""The real app, offscreen, answering a long question until the test kills it.

    python tests/app/app_kill_driver.py DATA_DIR

It builds the real MainWindow with its store in DATA_DIR, loads the default model, asks
for a long story, and prints "<monotonic clock> <characters so far>" for every streamed
update the window receives. tests/app/test_app_killed_mid_answer.py SIGKILLs it.
"""

import sys
import time
from dataclasses import replace
from pathlib import Path

from PySide6.QtWidgets import QApplication

from app.main_window import MainWindow
from app.settings import Settings
from app.storage import Store
from engine.bundled import default_model


def main(data: Path) -> int:
    """Run the window until killed."""
    app = QApplication(sys.argv[:1])
    settings = replace(Settings.defaults(), temperature=0.0, max_tokens=4000, models_folder=data / "models")
    store = Store(data / "sprig.sqlite3")
    window = MainWindow(store, settings, data / "settings.json")
    window.show()
    controller = window.controller
    controller.answer_text.connect(lambda text: print(f"{time.monotonic():.3f} {len(text)}", flush=True))
    controller.models.model_loaded.connect(
        lambda _info: controller.send("Write a very long story about a dragon who learns to cook."))
    window.add_model(str(default_model().path))
    return app.exec()


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
