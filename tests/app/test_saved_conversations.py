"""A conversation's KV cache is saved when it is left and when the app closes, and restored
when it answers again, so that only the new turn is read."""

import logging
import re
from dataclasses import replace

import pytest
from PySide6.QtWidgets import QLabel

from app.conversation_states import FOLDER, conversation_key
from engine.chat_session import ChatSession
from engine.saved_state import SUFFIX, read_header
from tests.app.conftest import ANSWER_TIMEOUT_MS, answer, load
from tests.gguf_factory import write_tiny_model


def state_file(window, conversation_id):
    return window.store.path.parent / FOLDER / f"{conversation_key(conversation_id)}{SUFFIX}"


@pytest.mark.any_model
def test_leaving_saves_the_state_and_reopening_restores_it(qtbot, window, caplog):
    controller = window.controller
    asked, _ = answer(qtbot, window, lambda: controller.send("Tell me about rivers."))
    first = controller.conversation.id
    held = controller.models.session.cache.tokens
    controller.open_conversation(None)  # left: saved on the engine thread
    qtbot.waitUntil(lambda: state_file(window, first).exists(), timeout=ANSWER_TIMEOUT_MS)
    assert read_header(state_file(window, first))["tokens"] == list(held)

    answer(qtbot, window, lambda: controller.send("Something else entirely."))  # the cache now holds another chat
    second = controller.conversation.id
    controller.open_conversation(first)
    qtbot.waitUntil(lambda: state_file(window, second).exists(), timeout=ANSWER_TIMEOUT_MS)

    with caplog.at_level(logging.INFO, logger="engine.saved_state"):
        metrics, state = answer(qtbot, window, lambda: controller.send("And lakes?"))
    assert state == "complete"
    restored = re.search(rf"restored (\d+) tokens of state for {conversation_key(first)}", caplog.text)
    assert restored and int(restored[1]) >= asked["prefill_tokens"]  # at least the whole first question
    assert metrics["prefill_tokens"] + int(restored[1]) + metrics["decode_tokens"] == metrics["context_used"]
    after = controller.models.session.cache.tokens

    window.close()  # closing saves the conversation it holds
    assert read_header(state_file(window, first))["tokens"] == list(after)


@pytest.mark.any_model
def test_a_damaged_state_is_ignored_and_the_answer_still_comes(qtbot, window, caplog):
    controller = window.controller
    answer(qtbot, window, lambda: controller.send("Tell me about rivers."))
    first = controller.conversation.id
    controller.open_conversation(None)
    qtbot.waitUntil(lambda: state_file(window, first).exists(), timeout=ANSWER_TIMEOUT_MS)
    answer(qtbot, window, lambda: controller.send("Something else entirely."))
    path = state_file(window, first)
    path.write_bytes(path.read_bytes()[:-100])  # truncated
    controller.open_conversation(first)

    with caplog.at_level(logging.WARNING, logger="engine.saved_state"):
        metrics, state = answer(qtbot, window, lambda: controller.send("And lakes?"))
    assert state == "complete" and metrics["decode_tokens"] > 0
    assert "was not used, the text is read again: it is truncated" in caplog.text
    # the user is told, quietly: a note in the conversation, not a banner over the window
    assert chat_notes(window) == ["This conversation was read again from its text: its saved state was not used "
                                  "(it is truncated)."]  # fmt: skip
    assert not window.info_banner.isVisible() and not window.error_banner.isVisible()
    answer(qtbot, window, lambda: controller.send("And seas?"))
    assert len(chat_notes(window)) == 1  # said once: the file is not read again


def chat_notes(window) -> list[str]:
    """The notes shown in the conversation (not the banners over the window)."""
    return [label.text() for label in window.chat_view.widget().findChildren(QLabel, "InfoBanner")]


@pytest.mark.any_model
def test_switching_models_saves_the_conversation_the_cache_holds(qtbot, window, tmp_path):
    controller = window.controller
    answer(qtbot, window, lambda: controller.send("Tell me about rivers."))
    first, held = controller.conversation.id, controller.models.session.cache.tokens
    assert not state_file(window, first).exists()  # not left: nothing saved yet
    load(qtbot, window, write_tiny_model(tmp_path / "other.gguf", arch="qwen3", seed=1))
    assert read_header(state_file(window, first))["tokens"] == list(held)


@pytest.mark.any_model
def test_closing_hides_the_window_before_the_state_is_saved(qtbot, window, monkeypatch):
    controller = window.controller
    answer(qtbot, window, lambda: controller.send("Tell me about rivers."))
    first, held = controller.conversation.id, controller.models.session.cache.tokens
    shown_while_saving: list[bool] = []
    save_state = ChatSession.save_state

    def watched(session):
        shown_while_saving.append(window.isVisible())
        return save_state(session)

    monkeypatch.setattr(ChatSession, "save_state", watched)
    window.close()
    assert shown_while_saving == [False]
    assert read_header(state_file(window, first))["tokens"] == list(held)


@pytest.mark.any_model
def test_deleting_a_conversation_deletes_its_state(qtbot, window):
    controller = window.controller
    answer(qtbot, window, lambda: controller.send("Tell me about rivers."))
    first = controller.conversation.id
    controller.open_conversation(None)
    qtbot.waitUntil(lambda: state_file(window, first).exists(), timeout=ANSWER_TIMEOUT_MS)
    controller.delete_conversation(first)
    assert not state_file(window, first).exists()


@pytest.mark.any_model
def test_a_cap_of_nothing_keeps_nothing(qtbot, window):
    controller = window.controller
    controller.settings = replace(controller.settings, saved_states_mb=0)
    answer(qtbot, window, lambda: controller.send("Tell me about rivers."))
    first = controller.conversation.id
    controller.open_conversation(None)
    answer(qtbot, window, lambda: controller.send("Something else."))  # runs after any save the leaving queued
    assert not state_file(window, first).exists()


@pytest.mark.any_model
def test_a_model_file_gone_after_loading_still_answers(qtbot, window, caplog):
    controller = window.controller
    controller.models.session.loaded.path.rename(controller.models.session.loaded.path.with_suffix(".moved"))
    with caplog.at_level(logging.WARNING, logger="app.conversation_states"):
        _, state = answer(qtbot, window, lambda: controller.send("Tell me about rivers."))
    assert state == "complete" and "the model file cannot be read" in caplog.text
