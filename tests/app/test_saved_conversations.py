"""A conversation's KV cache is saved when it is left and when the app closes, and restored
when it answers again, so that only the new turn is read."""

import logging
import re
from dataclasses import replace

import pytest

from app.conversation_states import FOLDER, conversation_key
from engine.saved_state import SUFFIX, read_header
from tests.app.conftest import ANSWER_TIMEOUT_MS, answer


def state_file(window, conversation_id):
    return window.store.path.parent / FOLDER / f"{conversation_key(conversation_id)}{SUFFIX}"


@pytest.mark.any_model
def test_leaving_saves_the_state_and_reopening_restores_it(qtbot, window, caplog):
    controller = window.controller
    asked, _ = answer(qtbot, window, lambda: controller.send("Tell me about rivers."))
    first = controller.conversation.id
    held = controller._session.cache.tokens
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
    after = controller._session.cache.tokens

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
    controller._session.loaded.path.rename(controller._session.loaded.path.with_suffix(".moved"))
    with caplog.at_level(logging.WARNING, logger="app.conversation_states"):
        _, state = answer(qtbot, window, lambda: controller.send("Tell me about rivers."))
    assert state == "complete" and "the model file cannot be read" in caplog.text
