"""Files opened from macOS's Finder arrive as QFileOpenEvents, not in argv (app/file_open.py)."""

from PySide6.QtCore import QCoreApplication, QEvent, QUrl
from PySide6.QtGui import QFileOpenEvent

from app.file_open import FileOpenFilter
from engine.bundled import bundled_model
from tests.app.conftest import LOAD_TIMEOUT_MS, close_window, make_window, quick_settings


def post_open(qapp, path: str) -> None:
    """What macOS does on a double-click: post a FileOpen event to the application."""
    QCoreApplication.postEvent(qapp, QFileOpenEvent(QUrl.fromLocalFile(path)))
    qapp.processEvents()


def test_files_opened_before_the_window_exists_are_delivered_once_it_does(qapp):
    opened = FileOpenFilter()
    qapp.installEventFilter(opened)
    try:
        post_open(qapp, "/models/first.gguf")
        post_open(qapp, "/models/second.gguf")
        received: list[str] = []
        opened.deliver_to(received.append)
        post_open(qapp, "/models/third.gguf")
    finally:
        qapp.removeEventFilter(opened)
    assert received == ["/models/first.gguf", "/models/second.gguf", "/models/third.gguf"]


def test_other_events_pass_through_the_filter(qapp):
    opened = FileOpenFilter()
    received: list[str] = []
    opened.deliver_to(received.append)
    assert opened.eventFilter(qapp, QEvent(QEvent.Type.ApplicationActivate)) is False
    assert received == []


def test_a_gguf_opened_from_finder_loads_in_the_window(qapp, qtbot, tmp_path):
    window = make_window(qtbot, tmp_path / "data", quick_settings(tmp_path))
    opened = FileOpenFilter()
    qapp.installEventFilter(opened)
    opened.deliver_to(window.open_from_launch)
    try:
        model = bundled_model("smollm2").path
        with qtbot.waitSignal(window.controller.models.model_loaded, timeout=LOAD_TIMEOUT_MS) as loaded:
            post_open(qapp, str(model))
        assert loaded.args[0].path == model
        post_open(qapp, str(tmp_path / "notes.txt"))
        assert "notes.txt is not a GGUF model file" in window.error_banner.text()
    finally:
        qapp.removeEventFilter(opened)
        close_window(window)
