"""The window on a remote server: from Settings → Models → "Add a server" to a streamed answer, and a failure."""

import sys

import pytest
from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication

from app.widgets.remote_models import MODEL, RemoteModels
from app.widgets.server_form import AddServerDialog
from engine.keyring_store import SERVICE
from engine.model_uri import parse_model_uri
from engine.remote import keys
from engine.remote.endpoints import Endpoint
from tests.app.conftest import answer, close_window, make_window, quick_settings
from tests.engine.remote.conftest import free_port, start_server, stop_server
from tests.engine.remote.faulty_server import FaultyServer
from tests.gguf_factory import write_tiny_model


@pytest.fixture(scope="module")
def sprig_url(tmp_path_factory):
    """`python -m engine serve` on a tiny model."""
    folder = tmp_path_factory.mktemp("remote-window")
    model = write_tiny_model(folder / "tiny.gguf", **{"qwen3.context_length": 1024})
    port = free_port()
    command = [sys.executable, "-m", "engine", "serve", "--model", str(model), "--backend", "numpy"]
    process = start_server([*command, "--port", str(port), "--alias", "tiny"], port, folder / "log.txt")
    yield f"http://127.0.0.1:{port}/v1"
    stop_server(process)


@pytest.fixture
def window(qtbot, tmp_path, memory_keyring):
    win = make_window(qtbot, tmp_path / "data", quick_settings(tmp_path))
    yield win
    close_window(win)


def fill_in_the_form(qtbot, url: str) -> None:
    """Fill the Add a server dialog that is open: the Sprig preset, the URL, a key, a name; Test; OK."""
    dialog = QApplication.activeModalWidget()
    assert isinstance(dialog, AddServerDialog)
    dialog.preset.setCurrentText("Sprig")
    dialog.base_url.setText(url)
    dialog.key.setText("sk-test")
    dialog.name.setText("Box")
    dialog.test_button.click()
    qtbot.waitUntil(lambda: dialog.test_button.isEnabled(), timeout=20_000)
    assert dialog.verdict.text() == "Found 1 model: tiny."
    dialog.accept()


def test_add_a_server_then_a_streamed_answer_from_it(qtbot, window, sprig_url, memory_keyring):
    QTimer.singleShot(0, lambda: fill_in_the_form(qtbot, sprig_url))
    assert window.add_server()
    assert window.store.endpoints() == [Endpoint("Box", sprig_url)]
    assert memory_keyring.saved == {(SERVICE, f"server:{sprig_url}"): "sk-test"}  # the key: keyring only

    picker = window.open_model_picker()
    remote = picker.findChild(RemoteModels)
    group = remote.tree.topLevelItem(0)
    assert group.text(0) == f"Box — {sprig_url}"
    qtbot.waitUntil(lambda: group.child(0).data(0, MODEL) is not None, timeout=20_000)
    group.child(0).setSelected(True)
    with qtbot.waitSignal(window.controller.models.remote_model_chosen):
        remote.use_button.click()
    picker.close()

    metrics, state = answer(qtbot, window, lambda: window.controller.send("Hello"))
    assert state == "complete" and metrics["decode_tokens"] > 0 and metrics["time_to_first_token_s"] > 0
    conversation = window.controller.conversation
    [_, reply] = window.store.messages(conversation.id)
    assert reply.content and reply.model == "tiny"
    ref = parse_model_uri(window.store.conversation(conversation.id).model_uri)
    assert (ref.base_url, ref.model_id) == (sprig_url, "tiny")


def test_a_cut_stream_keeps_the_partial_answer_marked_and_the_app_usable(qtbot, window, sprig_url):
    faulty = FaultyServer()
    try:
        window.controller.models.use_remote(Endpoint("Flaky", faulty.url("cut")), "m")
        metrics, state = answer(qtbot, window, lambda: window.controller.send("Hello"))
        assert state == "error"
        assert metrics["error"] == "Flaky closed the connection in the middle of the answer."
        assert window.error_banner.isVisibleTo(window) and "Flaky closed" in window.error_banner.text()
        [_, reply] = window.store.messages(window.controller.conversation.id)
        assert (reply.content, reply.state) == ("Half an answer", "error")
        window.controller.models.use_remote(Endpoint("Box", sprig_url), "tiny")
        assert answer(qtbot, window, lambda: window.controller.send("Again"))[1] == "complete"
    finally:
        faulty.close()
