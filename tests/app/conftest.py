"""Fixtures for the window tests: a real MainWindow, offscreen, on the real bundled model.

A test of the window's wiring that needs only *a* model is marked `any_model`: its
`window` then has a tiny synthetic model, which answers in milliseconds."""

from dataclasses import replace
from pathlib import Path

import pytest

from app.main_window import MainWindow
from app.settings import Settings
from app.storage import Store
from engine.bundled import bundled_model
from tests.gguf_factory import write_tiny_model

LOAD_TIMEOUT_MS = 120_000
ANSWER_TIMEOUT_MS = 180_000


def quick_settings(tmp_path: Path, **changes) -> Settings:
    """Defaults with greedy, short answers and a models folder inside tmp_path."""
    base = replace(Settings.defaults(), temperature=0.0, max_tokens=24, models_folder=tmp_path / "models")
    return replace(base, **changes)


def make_window(qtbot, data_dir: Path, settings: Settings) -> MainWindow:
    """A shown MainWindow with its store and settings in `data_dir`."""
    data_dir.mkdir(parents=True, exist_ok=True)
    store = Store(data_dir / "sprig.sqlite3")
    window = MainWindow(store, settings, data_dir / "settings.json")
    qtbot.addWidget(window)
    window.show()
    return window


def close_window(window: MainWindow) -> None:
    """Close the window (stopping the engine thread) and its store."""
    window.close()
    window.store.close()


def load(qtbot, window: MainWindow, path: Path | str) -> None:
    """Load `path` through the window and wait until it is ready."""
    with qtbot.waitSignal(window.controller.models.model_loaded, timeout=LOAD_TIMEOUT_MS):
        window.add_model(str(path))


def answer(qtbot, window: MainWindow, send) -> tuple[dict, str]:
    """Run `send()` and wait for the answer to finish; returns (metrics, state)."""
    with qtbot.waitSignal(window.controller.answer_finished, timeout=ANSWER_TIMEOUT_MS) as finished:
        assert send() is not False
    return tuple(finished.args)


@pytest.fixture
def window(qtbot, tmp_path, request):
    """A window with SmolLM2 loaded, greedy and short answers.

    Marked `any_model`: a tiny random-weight Qwen3 (4096-token context) instead. Its
    answers are byte soup, but real answers all the same: streamed, measured, stored.
    """
    if request.node.get_closest_marker("any_model"):
        model = write_tiny_model(tmp_path / "tiny-qwen3.gguf", arch="qwen3", **{"qwen3.context_length": 4096})
    else:
        model = bundled_model("smollm2").path
    win = make_window(qtbot, tmp_path / "data", quick_settings(tmp_path))
    load(qtbot, win, model)
    yield win
    close_window(win)



@pytest.fixture
def restore_look(qapp):
    """Put the app's palette, stylesheet and font back after a test that changes the look (they are app-wide)."""
    palette, sheet, font = qapp.palette(), qapp.styleSheet(), qapp.font()
    yield qapp
    qapp.setFont(font)
    qapp.setPalette(palette)
    qapp.setStyleSheet(sheet)
