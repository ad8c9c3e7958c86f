"""Gemma 4 in the window: the tiny MoE file loads, answers through its chat template, and is stored."""

from pathlib import Path

import pytest

from tests.app.conftest import answer, load

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "models"


@pytest.mark.any_model
def test_gemma4_chats_in_the_window(qtbot, window):
    load(qtbot, window, FIXTURES / "tiny-gemma4-moe-q4_k_m.gguf")
    assert " MoE, " in window.model_bar.details.text()
    _metrics, state = answer(qtbot, window, lambda: window.controller.send("Hello there"))
    assert state in ("complete", "length")
    stored = window.controller.store.messages(window.controller.conversation.id)
    assert stored[-1].role == "assistant" and stored[-1].content
