"""Issue 28's smaller slips: one context figure, the Edit box in sight, long words wrap, the version in About."""

import tomllib
from dataclasses import replace
from pathlib import Path

import pytest

from PySide6.QtCore import QPoint

from app.markdown_render import ZERO_WIDTH_SPACE, render_markdown
from app.menu_bar import show_about
from app.widgets.chat_view import ChatView
from tests.app.conftest import ANSWER_TIMEOUT_MS, answer


@pytest.mark.any_model
def test_the_top_bar_and_the_metrics_name_the_same_context(qtbot, window):
    trained = window.controller.model_info.context_length  # 4,096 for the tiny model
    window.apply_settings(replace(window.controller.settings, context_length=trained // 2))
    qtbot.waitUntil(lambda: not window.controller.busy, timeout=ANSWER_TIMEOUT_MS)
    metrics, _state = answer(qtbot, window, lambda: window.controller.send("Hello"))
    in_use = f"{metrics['context_size']:,}"
    assert metrics["context_size"] == trained // 2
    assert window.metrics.context.text().endswith(f"/ {in_use}")
    assert f"ctx {in_use} of {trained:,}" in window.model_bar.details.text()


def canvas_top(view: ChatView, widget) -> int:
    return widget.mapTo(view.widget(), QPoint(0, 0)).y()


def test_the_edit_box_opens_in_sight_with_its_first_line(qtbot):
    view = ChatView()
    qtbot.addWidget(view)
    view.resize(700, 500)
    view.show()
    question = "\n".join(f"Line {i} of a long question." for i in range(40))
    messages = []
    for position in range(0, 20, 2):
        messages.append({"position": position, "role": "user", "content": question})
        messages.append({"position": position + 1, "role": "assistant", "content": "An answer. " * 30})
    view.set_messages(messages)
    bar = view.verticalScrollBar()
    qtbot.waitUntil(lambda: bar.maximum() > 2000 and bar.value() == bar.maximum())  # at the bottom
    card = view.messages()[10]  # a question far above the bottom
    card.edit_button.click()
    panel = card.editor_panel
    qtbot.waitUntil(lambda: bar.value() <= canvas_top(view, panel) <= bar.value() + view.viewport().height() - 60)
    assert card.editor.textCursor().position() == 0
    assert card.editor.verticalScrollBar().value() == 0  # its first line shows
    qtbot.wait(100)  # and the view does not jump back to the bottom
    assert bar.value() <= canvas_top(view, panel) <= bar.value() + view.viewport().height() - 60


@pytest.mark.parametrize("content", ["x" * 3000, "See https://example.com/" + "a" * 500, "```\n" + "y" * 2000 + "\n```"])
def test_a_long_unbroken_answer_wraps_inside_the_view(qtbot, content):
    view = ChatView()
    qtbot.addWidget(view)
    view.resize(600, 500)
    view.show()
    view.set_messages([{"position": 0, "role": "assistant", "content": content}])
    card = view.messages()[0]
    label = card.body._labels[0]
    qtbot.waitUntil(lambda: label.height() > 5 * label.fontMetrics().height())  # wrapped onto many lines
    qtbot.waitUntil(lambda: label.geometry().right() < card.contentsRect().right())  # inside its card
    assert view.widget().width() <= view.viewport().width()
    text_width = label.fontMetrics().horizontalAdvance("x" * 20)
    assert label.width() < 600 and text_width < label.width(), (view.width(), view.viewport().width(), view.widget().width(), card.width(), card.body.width(), label.width())
    card.copy_to_clipboard()
    from PySide6.QtWidgets import QApplication
    assert ZERO_WIDTH_SPACE not in QApplication.clipboard().text()


def test_breaks_go_into_text_and_never_into_links_or_entities():
    url = "https://example.com/" + "a" * 100
    html = render_markdown(f"[link]({url}) and {'b' * 30}&{'c' * 60}")
    assert f'href="{url}"' in html  # the address itself is whole
    assert "&amp;" in html
    assert ZERO_WIDTH_SPACE in html.split("&amp;")[1]


def test_about_shows_the_version(qtbot):
    from PySide6.QtWidgets import QWidget
    parent = QWidget()
    qtbot.addWidget(parent)
    project = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text(encoding="utf-8"))
    box = show_about(parent)
    assert f"Sprig {project['project']['version']}" in box.text()
    box.close()


def test_an_answers_figures_line_never_widens_the_transcript(qtbot):
    view = ChatView()
    qtbot.addWidget(view)
    view.resize(520, 400)
    view.show()
    metrics = {"decode_tokens": 88, "decode_tok_s": 34.8, "time_to_first_token_s": 0.13, "prefill_tokens": 26,
               "prefill_tok_s": 203.0, "acceptance_rate": 0.5, "mean_accepted_length": 0.5}
    message = {"position": 1, "role": "assistant", "content": "Short.", "metrics": metrics,
               "model": "SmolLM2-135M-Instruct Q4_1 with a rather long name"}
    view.set_messages([{"position": 0, "role": "user", "content": "Hi"}, message])
    card = view.messages()[-1]
    qtbot.waitUntil(lambda: card.details_label.isVisible())
    qtbot.wait(50)
    assert view.widget().width() <= view.viewport().width()
    assert card.mapTo(view.viewport(), QPoint(card.width(), 0)).x() <= view.viewport().width()
    assert card.details_label.is_elided() and "SmolLM2" in card.details_label.text()
