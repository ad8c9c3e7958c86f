"""The mixture-of-experts families in the window: each loads, answers, and is stored, and the
top bar says what a token reads."""

from pathlib import Path

import pytest

from tests.app.conftest import answer, load

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "models"


@pytest.mark.any_model
@pytest.mark.parametrize("name", ["tiny-qwen3moe-q4_k_m", "tiny-gpt-oss-mxfp4"])
def test_an_moe_model_chats_in_the_window(qtbot, window, name):
    load(qtbot, window, FIXTURES / f"{name}.gguf")
    assert window.controller.model_info.active_parameters < window.controller.model_info.parameters
    assert " MoE, " in window.model_bar.details.text()
    _metrics, state = answer(qtbot, window, lambda: window.controller.send("Hello there"))
    assert state in ("complete", "length")
    stored = window.controller.store.messages(window.controller.conversation.id)
    assert stored[-1].role == "assistant" and stored[-1].content
