"""Base models open in the completion view: the model goes on with the user's text in place, streamed, with
Stop; one line says what base models are for and links to Get models; Chat anyway opens the chat."""

from dataclasses import replace

import pytest

from app.settings import sampling_params
from app.widgets.completion_view import GET_MODELS_LINK
from app.widgets.get_models_view import GetModelsView
from engine.builtin_templates import is_base_model
from engine.generation import generate
from engine.loader import load_model
from tests.app.conftest import ANSWER_TIMEOUT_MS, close_window, load, make_window, quick_settings
from tests.gguf_factory import write_tiny_model

BEGINNING = "Once upon a time"
TEMPLATE = "{% for m in messages %}{{ m.content }}{% endfor %}"
GEMMA = {"general.name": "Gemma 3 270m", "general.tags": ["gemma3", "text-generation"]}  # the bundled file's


@pytest.mark.parametrize(
    ("metadata", "file_name", "base"),
    [
        (
            {"general.name": "Gemma 3 270m", "general.tags": ["gemma3", "text-generation"]},
            "gemma-3-270m-q4_k_m.gguf",
            True,
        ),
        ({"general.name": "Qwen3 0.6B Base", "tokenizer.chat_template": TEMPLATE}, "qwen3-0.6b.gguf", True),
        (
            {"general.name": "Qwen3 0.6B", "general.finetune": "Base", "tokenizer.chat_template": TEMPLATE},
            "q.gguf",
            True,
        ),
        ({"general.name": "Mistral", "general.tags": ["base"], "tokenizer.chat_template": TEMPLATE}, "m.gguf", True),
        ({"general.name": "Smollm2 135M", "tokenizer.chat_template": TEMPLATE}, "SmolLM2-135M-Instruct.gguf", False),
        ({"general.name": "Gemma 3 270m It"}, "gemma-3-270m-it-q4_k_m.gguf", False),  # no template, but tuned
        ({"general.name": "Database helper", "tokenizer.chat_template": TEMPLATE}, "database-helper.gguf", False),
    ],
)
def test_the_base_model_rule(metadata, file_name, base):
    assert is_base_model(metadata, file_name) is base


@pytest.fixture
def base_window(qtbot, tmp_path):
    """A window on a tiny model whose name says it is a base model (numpy, greedy, 24 tokens)."""
    model = write_tiny_model(tmp_path / "tiny.gguf", **{"general.name": "Tiny Base", "qwen3.context_length": 1024})
    window = make_window(qtbot, tmp_path / "data", quick_settings(tmp_path, backend="numpy", repeat_penalty=1.0))
    load(qtbot, window, model)
    yield window, model
    close_window(window)


def reference_continuation(model, settings, text: str) -> str:
    """The tiny model's greedy continuation of `text`, straight from the engine, in a cache of its own."""
    loaded = load_model(model, "numpy")
    try:
        prompt = loaded.tokenizer.encode(text)
        events = generate(
            loaded.model, loaded.tokenizer, loaded.new_cache(1024), prompt, sampling_params(settings),
            max_tokens=settings.max_tokens,
        )  # fmt: skip
        return "".join(event.text for event in events)
    finally:
        loaded.close()


def test_a_base_model_continues_the_text_in_place(qtbot, base_window):
    window, model = base_window
    view = window.completion
    assert window.pages.currentWidget() is view and view.isVisibleTo(window)
    assert window.menu_actions["completion"].isChecked()
    line = view.explanation.text()
    assert "Tiny Base" in line and "base model" in line and f'href="{GET_MODELS_LINK}"' in line

    view.editor.setPlainText(BEGINNING)
    with qtbot.waitSignal(window.controller.completion_finished, timeout=ANSWER_TIMEOUT_MS) as finished:
        view.run_button.click()
        assert view.run_button.text() == "Stop" and view.editor.isReadOnly()
    metrics, state = finished.args
    assert state == "complete" and metrics["decode_tokens"] > 0
    expected = reference_continuation(model, window.controller.settings, BEGINNING)
    assert expected and view.editor.toPlainText() == BEGINNING + expected
    assert view.run_button.text() == "Continue" and not view.editor.isReadOnly()
    assert window.store.conversations() == []  # a completion is not a chat


def test_stop_ends_a_completion_and_keeps_its_text(qtbot, base_window):
    window, _ = base_window
    view = window.completion
    window.apply_settings(replace(window.controller.settings, max_tokens=900))
    qtbot.waitUntil(lambda: not window.controller.busy, timeout=ANSWER_TIMEOUT_MS)
    view.editor.setPlainText(BEGINNING)
    window.controller.completion_text.connect(lambda _text: view.run_button.click())  # Stop at the first words
    with qtbot.waitSignal(window.controller.completion_finished, timeout=ANSWER_TIMEOUT_MS) as finished:
        view.run_button.click()
    metrics, state = finished.args
    assert state == "cancelled" and 0 < metrics["decode_tokens"] < 900
    assert view.editor.toPlainText().startswith(BEGINNING) and len(view.editor.toPlainText()) > len(BEGINNING)
    assert view.run_button.text() == "Continue"


def test_chat_anyway_and_back_and_the_get_models_link(qtbot, base_window):
    window, _ = base_window
    window.completion.chat_button.click()
    assert window.pages.currentWidget() is window.chat_page
    assert not window.menu_actions["completion"].isChecked()
    window.menu_actions["completion"].trigger()
    assert window.pages.currentWidget() is window.completion
    window.completion.explanation.linkActivated.emit(GET_MODELS_LINK)
    assert [view for view in window.findChildren(GetModelsView) if view.isVisible()]


def test_a_chat_model_opens_in_the_chat(qtbot, tmp_path):
    model = write_tiny_model(tmp_path / "tiny-instruct.gguf", **{"general.name": "Tiny Instruct"})
    window = make_window(qtbot, tmp_path / "data", quick_settings(tmp_path, backend="numpy"))
    try:
        load(qtbot, window, model)
        assert window.pages.currentWidget() is window.chat_page
        assert not window.menu_actions["completion"].isChecked()
    finally:
        close_window(window)
