"""The Get models view, against the loopback Hub: from an empty library to a loaded model, offline, gated."""

from dataclasses import replace

import pytest
from huggingface_hub import constants
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QMessageBox

from app.widgets.get_models_view import GetModelsView
from app.widgets.model_picker import FILE
from engine.hub import tokens
from engine.hub.search import RECOMMENDED
from engine.model_info import format_bytes
from tests.app.conftest import ANSWER_TIMEOUT_MS, LOAD_TIMEOUT_MS, answer, close_window, make_window, quick_settings
from tests.hub_server import tiny_model_repo

REPO = "sprig-tests/tiny-qwen3-GGUF"
WAIT_MS = 20_000


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """The Hugging Face cache the app uses (huggingface_hub's own default), in tmp_path."""
    folder = tmp_path / "hf"
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(folder))
    return folder


@pytest.fixture
def window(qtbot, tmp_path, cache, fake_hub, memory_keyring):
    """A window with no model loaded, and the fake Hub serving the tiny repository."""
    fake_hub.repos[REPO] = tiny_model_repo(tmp_path)
    win = make_window(qtbot, tmp_path / "data", quick_settings(tmp_path))
    yield win
    close_window(win)


def open_view(window) -> GetModelsView:
    window.menu_actions["get_models"].trigger()
    [view] = [v for v in window.findChildren(GetModelsView) if v.isVisible()]
    return view


def cell(table, row: int, column: int) -> str:
    item = table.item(row, column)
    return item.text() if item is not None else ""


def search_and_open(qtbot, view: GetModelsView, text: str, repo_id: str) -> None:
    view.search.setText(text)
    qtbot.mouseClick(view.search_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: cell(view.repos, 0, 0).startswith(repo_id), timeout=WAIT_MS)
    view.repos.selectRow(0)
    qtbot.waitUntil(lambda: view.files.rowCount() > 0 and repo_id in view.repo_label.text(), timeout=WAIT_MS)


def test_from_search_to_a_loaded_model_and_an_answer(qtbot, window, cache, fake_hub):
    view = open_view(window)
    assert [cell(view.repos, row, 0).removesuffix("  🔒") for row in range(view.repos.rowCount())] == [
        r.repo_id for r in RECOMMENDED
    ]
    assert cell(view.repos, 0, 1) == RECOMMENDED[0].why

    search_and_open(qtbot, view, "tiny", REPO)
    assert (cell(view.repos, 0, 2), cell(view.repos, 0, 3), cell(view.repos, 0, 5)) == ("1,234", "56", "apache-2.0")
    rows = {cell(view.files, row, 1): row for row in range(view.files.rowCount())}
    assert set(rows) == {"F32", "Q8_0"}
    for row in rows.values():
        assert cell(view.files, row, 4).startswith("fits — needs")  # a tiny model fits anywhere
    picked = view.files.selectionModel().selectedRows()[0].row()
    assert cell(view.files, picked, 0) == "★" and cell(view.files, picked, 1) == "F32"  # the largest that fits
    view.files.selectRow(rows["Q8_0"])

    with qtbot.waitSignal(window.hub.download_finished, timeout=WAIT_MS) as finished:
        qtbot.mouseClick(view.download_button, Qt.MouseButton.LeftButton)
    path = finished.args[0].path
    assert path.parents[2] == cache / "models--sprig-tests--tiny-qwen3-GGUF"
    assert path.read_bytes() == fake_hub.repos[REPO].files["tiny-qwen3-Q8_0.gguf"]
    assert window.model_bar.download_button.text() == "✓ Downloaded"
    assert "downloaded and verified" in view.status.text()
    assert view.load_button.isEnabled()

    with qtbot.waitSignal(window.controller.models.model_loaded, timeout=LOAD_TIMEOUT_MS):
        qtbot.mouseClick(view.load_button, Qt.MouseButton.LeftButton)
    assert window.controller.loaded.path == path
    _metrics, state = answer(qtbot, window, lambda: window.send("Hello"))
    assert state == "complete"

    picker = window.open_model_picker()
    files = [picker.table.item(row, FILE).text() for row in range(picker.table.rowCount())]
    assert f"tiny-qwen3-Q8_0.gguf — Hugging Face · {REPO}" in files
    picker.close()


def test_offline_lists_what_is_downloaded_and_says_search_needs_a_network(qtbot, window, cache):
    view = open_view(window)
    search_and_open(qtbot, view, "tiny", REPO)
    with qtbot.waitSignal(window.hub.download_finished, timeout=WAIT_MS):
        qtbot.mouseClick(view.download_button, Qt.MouseButton.LeftButton)
    view.close()

    window.apply_settings(replace(window.controller.settings, hub_offline=True))
    view = open_view(window)
    assert "Offline: search needs a network" in view.notice.text()
    assert view.files.rowCount() == 1 and cell(view.files, 0, 2) == f"{REPO} · tiny-qwen3-F32"
    assert cell(view.files, 0, 4).startswith(str(cache))  # where it lives
    view.search.setText("tiny")
    qtbot.mouseClick(view.search_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: "Offline mode is on" in view.notice.text(), timeout=WAIT_MS)
    view.files.selectRow(0)
    with qtbot.waitSignal(window.controller.models.model_loaded, timeout=LOAD_TIMEOUT_MS):
        qtbot.mouseClick(view.load_button, Qt.MouseButton.LeftButton)


def test_a_gated_model_asks_for_a_token_kept_in_the_keyring(qtbot, window, fake_hub, memory_keyring):
    fake_hub.repos[REPO].token = "hf_s3cret"
    view = open_view(window)
    search_and_open(qtbot, view, "tiny", REPO)
    with qtbot.waitSignal(window.hub.download_stopped, timeout=WAIT_MS):
        qtbot.mouseClick(view.download_button, Qt.MouseButton.LeftButton)
    assert view.token_row.isVisible()
    assert "gated" in view.token_label.text() and f"{constants.ENDPOINT}/{REPO}" in view.token_label.text()
    view.token.setText("hf_s3cret")
    qtbot.mouseClick(view.save_token_button, Qt.MouseButton.LeftButton)
    assert tokens.stored_token() == "hf_s3cret" and not view.token_row.isVisible()
    assert "hf_s3cret" not in window.store.path.read_bytes().decode("latin-1")  # never in the database
    with qtbot.waitSignal(window.hub.download_finished, timeout=WAIT_MS):
        qtbot.mouseClick(view.download_button, Qt.MouseButton.LeftButton)


def test_a_download_pauses_and_resumes(qtbot, window, fake_hub):
    fake_hub.chunk_delay_s = 0.05
    view = open_view(window)
    search_and_open(qtbot, view, "tiny", REPO)
    with qtbot.waitSignal(window.hub.progress, timeout=WAIT_MS):
        qtbot.mouseClick(view.download_button, Qt.MouseButton.LeftButton)
    with qtbot.waitSignal(window.hub.download_stopped, timeout=WAIT_MS):
        qtbot.mouseClick(view.pause_button, Qt.MouseButton.LeftButton)
    assert view.pause_button.text() == "Resume" and "paused" in view.status.text()
    assert window.model_bar.download_button.text() == "⏸ Paused"
    fake_hub.chunk_delay_s = 0
    with qtbot.waitSignal(window.hub.download_finished, timeout=ANSWER_TIMEOUT_MS):
        qtbot.mouseClick(view.pause_button, Qt.MouseButton.LeftButton)
    assert "range" in fake_hub.file_requests("tiny-qwen3-F32.gguf")[-1]


def test_the_library_deletes_a_download_after_saying_its_size(qtbot, window, cache, monkeypatch):
    view = open_view(window)
    search_and_open(qtbot, view, "tiny", REPO)
    with qtbot.waitSignal(window.hub.download_finished, timeout=WAIT_MS) as finished:
        qtbot.mouseClick(view.download_button, Qt.MouseButton.LeftButton)
    path = finished.args[0].path
    view.close()
    asked = []
    monkeypatch.setattr(QMessageBox, "question", lambda _parent, _title, text: asked.append(text) or QMessageBox.Yes)
    picker = window.open_model_picker()
    row = next(r for r in range(picker.table.rowCount()) if path.name in picker.table.item(r, FILE).text())
    picker.table.selectRow(row)
    size = path.stat().st_size
    qtbot.mouseClick(picker.delete_button, Qt.MouseButton.LeftButton)
    assert f"It frees {format_bytes(size)} of disk" in asked[0] and str(path) in asked[0]
    assert not path.exists() and not (cache / "models--sprig-tests--tiny-qwen3-GGUF").exists()
    assert all(path.name not in entry.path.name for entry in window.library())
