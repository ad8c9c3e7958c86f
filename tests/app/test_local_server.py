"""The window's "Local server" switch serves the loaded model, beside the chat, without mixing them up."""

import json
import shlex
import shutil
import subprocess
import threading

import openai
import pytest
from PySide6.QtWidgets import QApplication

from app.settings import sampling_params
from engine.chat_session import ChatSession
from engine.loader import load_model
from engine.server.scheduler import SERVER, Ticket
from tests.app.conftest import answer, close_window, load, make_window, quick_settings
from tests.gguf_factory import write_tiny_model

HELLO = [{"role": "user", "content": "hello"}]  # the tiny model answers this greedily without stopping


@pytest.fixture
def served_window(qtbot, tmp_path):
    """A window on a tiny model (context 1024), its server switched on from the menu, on a free port."""
    model = write_tiny_model(tmp_path / "tiny.gguf", **{"qwen3.context_length": 1024})
    win = make_window(qtbot, tmp_path / "data", quick_settings(tmp_path, context_length=1024))
    load(qtbot, win, model)
    win.local_server.port = 0
    win.menu_actions["local_server"].trigger()
    yield win, model
    close_window(win)


def test_switch_serves_the_loaded_model_and_shows_its_traffic(qtbot, served_window):
    window, _model = served_window
    server, panel = window.local_server, window.server_panel
    assert server.running and panel.isVisible() and panel.switch.isChecked()
    assert window.menu_actions["local_server"].isChecked()
    assert panel.address.text() == server.address and server.address.startswith("http://127.0.0.1:")
    client = openai.OpenAI(base_url=server.address, api_key="unused", max_retries=0, timeout=30)
    assert [m.id for m in client.models.list()] == ["tiny"]
    reply = client.chat.completions.create(model="tiny", messages=HELLO, max_tokens=5, temperature=0)
    assert reply.usage.completion_tokens == 5
    qtbot.waitUntil(lambda: panel.counts.text() == "1 request · 0 waiting", timeout=5000)

    panel.copy_button.click()
    curl = QApplication.clipboard().text()
    assert curl == panel.curl.text() and server.address in curl and '"model": "tiny"' in curl
    if shutil.which("curl") is None:
        pytest.skip("curl is not installed: the copied example was not run")
    result = subprocess.run(shlex.split(curl), check=True, capture_output=True, text=True, timeout=60)
    assert json.loads(result.stdout)["object"] == "chat.completion"

    panel.switch.click()  # off
    assert not server.running and not window.menu_actions["local_server"].isChecked()
    with pytest.raises(openai.APIConnectionError):
        client.models.list()


def test_chat_and_server_share_the_model_without_mixing_their_state(qtbot, served_window, tmp_path):
    window, model = served_window
    client = openai.OpenAI(base_url=window.local_server.address, api_key="unused", max_retries=0, timeout=60)

    def ask(max_tokens):
        return client.chat.completions.create(model="tiny", messages=HELLO, max_tokens=max_tokens,
                                              temperature=0).choices[0].message.content

    before = ask(300)
    streamed = {}

    def stream_in_background():
        streamed["text"] = ask(300)

    thread = threading.Thread(target=stream_in_background)
    thread.start()
    _metrics, state = answer(qtbot, window, lambda: window.send("Tell me about rivers"))
    thread.join(60)
    assert state == "complete"
    assert streamed["text"] == before  # the chat's turn in between changed nothing in the server's answer

    settings = window.controller.settings
    # The same chat, alone, on a model of its own, on the same backend.
    reference = load_model(model, window.controller.loaded.backend.name)
    try:
        session = ChatSession(reference, system_prompt=settings.system_prompt, n_ctx=1024,
                              params=sampling_params(settings), max_tokens=settings.max_tokens)
        expected = "".join(event.text for event in session.send("Tell me about rivers"))
    finally:
        reference.close()
    stored = window.store.messages(window.controller.conversation.id)
    assert stored[-1].content == expected


def test_a_chat_answer_stopped_while_it_waits_for_the_model_is_cancelled(qtbot, served_window):
    window, _model = served_window
    scheduler = window.controller.models.scheduler
    release, holding = threading.Event(), threading.Event()

    def hold(cancel):  # holds the model in its turn (as a long prefill does) until released
        holding.set()
        release.wait(30)
        yield from ()

    scheduler.submit(Ticket(hold, lambda item: None, SERVER))
    assert holding.wait(5)
    try:
        with qtbot.waitSignal(window.controller.answer_finished, timeout=60_000) as finished:
            assert window.send("Tell me about rivers") is not False
            qtbot.waitUntil(lambda: scheduler.waiting == 1, timeout=5000)
            window.controller.cancel()
            release.set()
    finally:
        release.set()
    _metrics, state = finished.args
    assert state == "cancelled"
    assert scheduler.stats.skipped == 1  # it never ran
    assert not window.controller.busy
