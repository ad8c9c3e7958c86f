"""An answer cut by a full context says so, and offers Continue (dropping the oldest turns) and a new
chat that starts from a summary."""

from dataclasses import replace

import pytest

from app.storage import CUT_BY_CONTEXT
from tests.app.conftest import ANSWER_TIMEOUT_MS, answer



def use(qtbot, window, **changes) -> None:
    """Apply settings and wait for the session they may rebuild."""
    window.apply_settings(replace(window.controller.settings, **changes))
    qtbot.waitUntil(lambda: not window.controller.busy, timeout=ANSWER_TIMEOUT_MS)


def fill_the_context(qtbot, window, context: int = 256, question: str = "Tell me everything.") -> dict:
    """Ask with a small context and no token limit to speak of: the answer runs into the context's end."""
    use(qtbot, window, context_length=context, max_tokens=4000)
    metrics, state = answer(qtbot, window, lambda: window.controller.send(question))
    assert state == "complete"
    return metrics


@pytest.mark.any_model
def test_the_cut_answer_says_the_context_is_full_and_offers_what_can_be_done(qtbot, window):
    metrics = fill_the_context(qtbot, window)
    assert metrics["finish_reason"] == CUT_BY_CONTEXT
    last = window.chat_view.messages()[-1]
    assert last.note.isVisible()
    assert "context is full" in last.note.text() and f"of {metrics['context_size']:,} tokens" in last.note.text()
    assert last.continue_button.isVisibleTo(window) and last.summary_button.isVisibleTo(window)
    stored = window.store.messages(window.controller.conversation.id)[-1]
    assert stored.metrics["finish_reason"] == CUT_BY_CONTEXT  # the note comes back with the chat


@pytest.mark.any_model
def test_a_new_chat_starts_from_a_summary_and_the_old_one_stays(qtbot, window):
    fill_the_context(qtbot, window, context=512)
    old = window.controller.conversation
    old_messages = [m.content for m in window.store.messages(old.id)]
    with qtbot.waitSignal(window.controller.conversation_opened, timeout=ANSWER_TIMEOUT_MS) as opened:
        window.chat_view.messages()[-1].summary_button.click()
    new, messages = opened.args
    assert new.id != old.id and messages == []
    prompt = window.store.conversation(new.id).overrides["system_prompt"]
    assert prompt.startswith(window.controller.settings.system_prompt)
    summary = prompt.split("to continue from:\n", 1)[1]
    assert summary.strip()
    assert window.info_banner.isVisible() and summary[:20] in window.info_banner.text()
    assert [m.content for m in window.store.messages(old.id)] == old_messages
    # The new chat answers with the summary in its prompt.
    metrics, state = answer(qtbot, window, lambda: window.controller.send("Go on."))
    assert state == "complete", metrics


LONG_QUESTION = " ".join(["Here is a long question about rivers, mountains and the sea."] * 12)


def test_continue_drops_the_oldest_turns_to_make_room(qtbot, window):  # SmolLM2: real text, real tokens
    use(qtbot, window, context_length=512, max_tokens=4)
    answer(qtbot, window, lambda: window.controller.send(LONG_QUESTION))
    answer(qtbot, window, lambda: window.controller.send(LONG_QUESTION))
    story = "Write a very long story about a dragon who learns to cook, chapter after chapter."
    metrics = fill_the_context(qtbot, window, context=512, question=story)
    assert metrics["finish_reason"] == CUT_BY_CONTEXT
    cut = window.store.messages(window.controller.conversation.id)[-1].content
    metrics, state = answer(qtbot, window, window.chat_view.messages()[-1].continue_button.click)
    assert state == "complete", metrics
    continued = window.store.messages(window.controller.conversation.id)[-1].content
    assert continued.startswith(cut) and len(continued) > len(cut)


@pytest.mark.any_model
def test_where_no_turn_can_go_continue_says_so_and_the_answer_stays_as_it_was(qtbot, window):
    metrics = fill_the_context(qtbot, window)
    before = window.store.messages(window.controller.conversation.id)[-1]
    _metrics, state = answer(qtbot, window, window.chat_view.messages()[-1].continue_button.click)
    assert "no room to continue" in window.error_banner.text() and "summary" in window.error_banner.text()
    after = window.store.messages(window.controller.conversation.id)[-1]
    assert (after.content, after.state, after.metrics) == (before.content, before.state, before.metrics)
    assert state == before.state
    card = window.chat_view.messages()[-1]
    assert "context is full" in card.note.text() and card.summary_button.isVisibleTo(window)
    assert metrics["finish_reason"] == CUT_BY_CONTEXT
