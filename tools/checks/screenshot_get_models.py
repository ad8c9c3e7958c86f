"""A screenshot of Get models at 1366×768, against the tests' loopback Hub (no network).

    xvfb-run -s "-screen 0 1366x768x24" .venv/bin/python tools/checks/screenshot_get_models.py docs/screenshots

The repositories listed are made up (random bytes under the usual quantizations' names,
made-up figures); the fit verdicts and the recommended pick are computed as for real ones. The shot shows a download under way:
the view (search, files with fit verdicts and the pick) over the window, whose top bar
shows the download indicator.
"""

import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.hub_server import STATE, FakeRepo, start  # noqa: E402  (sets HF_ENDPOINT first)

from PySide6.QtWidgets import QApplication  # noqa: E402

from app.main_window import MainWindow  # noqa: E402
from app.settings import Settings  # noqa: E402
from app.storage import Store  # noqa: E402
from app.theme import apply_theme  # noqa: E402
from tools.checks.take_screenshots import settle, wait_until  # noqa: E402

REPO = "sprig-tests/Tiny-Qwen3-GGUF"


def main(folder: Path) -> int:
    """Open the window at 1366×768, search, pick a file, start its download, and shoot the screen."""
    app = QApplication(sys.argv[:1])
    apply_theme(app, "light")
    start()
    with tempfile.TemporaryDirectory() as tmp:
        bits = {"Q2_K": 2.6, "Q3_K_M": 3.9, "Q4_K_M": 4.9, "Q5_K_M": 5.7, "Q6_K": 6.6, "Q8_0": 8.5}
        files = {f"Tiny-Qwen3-{q}.gguf": os.urandom(int(b * 1_000_000)) for q, b in bits.items()}
        STATE.repos[REPO] = FakeRepo(
            files, downloads=48_213, likes=312, gguf={"total": 8_000_000, "architecture": "qwen3"}
        )
        coder = {"Tiny-Qwen3-Coder-Q4_K_M.gguf": os.urandom(5_000_000)}
        STATE.repos["sprig-tests/Tiny-Qwen3-Coder-GGUF"] = FakeRepo(coder, downloads=9_120, likes=41, license="mit")
        STATE.chunk_delay_s = 0.05  # slow enough to catch the download under way
        store = Store(Path(tmp) / "sprig.sqlite3")
        window = MainWindow(store, Settings.defaults(), Path(tmp) / "settings.json")
        window.resize(1366, 768)
        window.move(0, 0)
        window.show()
        view = window.open_get_models()
        view.move(123, 50)
        view.search.setText("qwen3")
        view.run_search()
        wait_until(lambda: view.repos.rowCount() == 2, 30)
        view.repos.selectRow(0)
        wait_until(lambda: view.files.rowCount() == 6, 30)
        view.download_button.click()
        wait_until(lambda: window.model_bar.download_button.isVisible(), 30)
        settle(2.0)
        path = folder / "8-get-models-1366x768.png"
        QApplication.primaryScreen().grabWindow(0).save(str(path))
        print(f"wrote {path}")
        window.hub.pause()
        window.close()
        store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
