"""The window on a remote server: from Settings → Models → "Add a server" to a streamed answer, a failure, and
regenerate, edit and continue, each checked against the same model answering in this process."""

import sys
from pathlib import Path

import pytest
from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication

from app.settings import Settings, sampling_params
from app.widgets.remote_models import MODEL, RemoteModels
from app.widgets.server_form import AddServerDialog
from engine.chat_session import ChatSession
from engine.keyring_store import SERVICE
from engine.loader import load_model
from engine.model_uri import parse_model_uri
from engine.remote.endpoints import Endpoint
from tests.app.conftest import answer, close_window, make_window, quick_settings
from tests.engine.remote.conftest import free_port, start_server, stop_server
from tests.engine.remote.faulty_server import FaultyServer
from tests.gguf_factory import write_tiny_model


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    """A tiny random-weight Qwen3 with a 1024-token context."""
    return write_tiny_model(tmp_path_factory.mktemp("remote-window") / "tiny.gguf", **{"qwen3.context_length": 1024})


@pytest.fixture(scope="module")
def sprig_url(tiny_model):
    """`python -m engine serve` on the tiny model."""
    model, folder = tiny_model, tiny_model.parent
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


def local_answer(model: Path, settings: Settings, messages: list[dict], continuing: bool = False) -> str:
    """The answer the tiny model gives to `messages` in this process (with `continuing`, what it adds to the
    last message, an answer to go on with): what the server must have been asked for the window's answer."""
    loaded = load_model(model, "numpy")
    try:
        session = ChatSession(loaded, n_ctx=1024, params=sampling_params(settings), max_tokens=settings.max_tokens)
        if continuing:
            session.messages = list(messages)
            events = session.continue_answer()
        else:
            session.messages = list(messages[:-1])
            events = session.send(messages[-1]["content"])
        return "".join(event.text for event in events)
    finally:
        loaded.close()


def test_regenerate_edit_and_continue_with_a_remote_model(qtbot, tmp_path, sprig_url, tiny_model, memory_keyring):
    settings = quick_settings(tmp_path, system_prompt="", repeat_penalty=1.0, max_tokens=6)
    window = make_window(qtbot, tmp_path / "data", settings)
    try:
        store, view = window.store, window.chat_view
        window.controller.models.use_remote(Endpoint("Box", sprig_url), "tiny")
        assert answer(qtbot, window, lambda: window.controller.send("Hello"))[1] == "complete"
        conversation = window.controller.conversation.id
        first = store.messages(conversation)[-1].content
        assert first == local_answer(tiny_model, settings, [{"role": "user", "content": "Hello"}])

        assert answer(qtbot, window, view.regenerate_requested.emit)[1] == "complete"
        [_, regenerated] = store.messages(conversation)
        assert len(regenerated.versions) == 1 and regenerated.versions[0]["content"] == first  # kept as version 1
        assert regenerated.content == first  # greedy: the same question, asked again without the old answer

        assert answer(qtbot, window, lambda: view.edit_submitted.emit(0, "Goodbye"))[1] == "complete"
        [question, edited] = store.messages(conversation)
        assert question.content == "Goodbye" and len(question.versions) == 1
        assert edited.content == local_answer(tiny_model, settings, [{"role": "user", "content": "Goodbye"}])
        assert edited.metrics["finish_reason"] == "length"  # cut at 6 tokens: it can be continued

        assert answer(qtbot, window, view.continue_requested.emit)[1] == "complete"
        [_, continued] = store.messages(conversation)
        history = [{"role": "user", "content": "Goodbye"}, {"role": "assistant", "content": edited.content}]
        added = local_answer(tiny_model, settings, history, continuing=True)
        assert added and continued.content == edited.content + added  # gone on with, not answered anew
    finally:
        close_window(window)
