"""The chat view and its message cards, driven as the controller and the user drive them."""

import time

import pytest
from PySide6.QtCore import QEvent, QObject, QPoint, QPointF, Qt, QUrl, Slot
from PySide6.QtGui import QDesktopServices, QMouseEvent
from PySide6.QtWidgets import QApplication, QLabel

from app.widgets.chat_view import ChatView
from app.widgets.markdown_view import RichLabel

METRICS = {
    "prefill_tokens": 380, "prefill_tok_s": 380.4, "time_to_first_token_s": 0.42,
    "decode_tokens": 128, "decode_tok_s": 31.2, "last_token_latency_s": 0.0321,
    "context_used": 508, "context_size": 2048,
}
CODE_ANSWER = "Two blocks:\n\n```python\nprint('first')\n```\n\nand\n\n```bash\necho second\n```\n"


def message(position: int, role: str, content: str, state: str = "complete", metrics: dict | None = None) -> dict:
    """A message dict as the controller hands it to the view."""
    return {"position": position, "role": role, "content": content,
            "model": "SmolLM2-135M" if role == "assistant" else None, "metrics": metrics, "state": state}


def settle() -> None:
    """Let posted layout requests and repaints run (they take a few event-loop turns)."""
    for _ in range(6):
        QApplication.processEvents()


def send_mouse(widget, kind: QEvent.Type, point: QPoint, button=Qt.MouseButton.NoButton) -> None:
    """Deliver one mouse event to `widget` (QTest.mouseMove leaks references in PySide 6.12)."""
    local = QPointF(point)
    event = QMouseEvent(kind, local, widget.mapToGlobal(local), button, button, Qt.KeyboardModifier.NoModifier)
    QApplication.sendEvent(widget, event)


def click_link(card, href: str) -> None:
    """Find the link `href` in a card's text by hovering over it, then click it."""
    for label in card.body.findChildren(QLabel):
        hovered = []
        label.linkHovered.connect(hovered.append)
        for y in range(0, label.height(), 3):
            for x in range(0, label.width(), 6):
                send_mouse(label, QEvent.Type.MouseMove, QPoint(x, y))
                if hovered and hovered[-1] == href:
                    send_mouse(label, QEvent.Type.MouseButtonPress, QPoint(x, y), Qt.MouseButton.LeftButton)
                    send_mouse(label, QEvent.Type.MouseButtonRelease, QPoint(x, y), Qt.MouseButton.LeftButton)
                    return
    raise AssertionError(f"no link {href} under the mouse anywhere in the card")


def shown(widget) -> bool:
    """Visible as far as its own card is concerned."""
    return not widget.isHidden()


@pytest.fixture
def view(qtbot):
    """A shown, 800×600 chat view."""
    chat = ChatView()
    qtbot.addWidget(chat)
    chat.resize(800, 600)
    chat.show()
    qtbot.waitExposed(chat)
    return chat


# -- copying -----------------------------------------------------------------------------


def test_copy_puts_the_raw_message_on_the_clipboard(view, qtbot):
    view.set_messages([message(0, "user", "Explain *this*:\n\n    x = 1"),
                       message(1, "assistant", "<think>User wants x.</think>\n\nIt sets **x**.")])
    user, answer = view.messages()
    qtbot.mouseClick(user.copy_button, Qt.MouseButton.LeftButton)
    assert QApplication.clipboard().text() == "Explain *this*:\n\n    x = 1"
    qtbot.mouseClick(answer.copy_button, Qt.MouseButton.LeftButton)
    assert QApplication.clipboard().text() == "It sets **x**."  # the answer, without its reasoning


def test_clicking_a_copy_code_link_copies_exactly_that_block(view):
    card = view.append_message(message(1, "assistant", CODE_ANSWER))
    settle()
    QApplication.clipboard().setText("unchanged")
    click_link(card, "copy-code:1")
    assert QApplication.clipboard().text() == "echo second\n"
    click_link(card, "copy-code:0")
    assert QApplication.clipboard().text() == "print('first')\n"


class UrlCatcher(QObject):
    """Receives the URLs QDesktopServices would open in the browser."""

    def __init__(self):
        super().__init__()
        self.opened: list[str] = []

    @Slot(QUrl)
    def open(self, url: QUrl) -> None:
        """Record instead of opening."""
        self.opened.append(url.toString())


@pytest.fixture
def url_catcher():
    """Catch what would open in the browser, for the schemes a link could carry."""
    catcher = UrlCatcher()
    schemes = ("http", "https", "file", "ftp")
    for scheme in schemes:
        QDesktopServices.setUrlHandler(scheme, catcher, "open")
    yield catcher
    for scheme in schemes:
        QDesktopServices.unsetUrlHandler(scheme)


def test_web_links_open_in_the_browser_and_other_schemes_never(view, url_catcher):
    card = view.append_message(message(1, "assistant", "See [the docs](https://docs.python.org/3/)."))
    settle()
    click_link(card, "https://docs.python.org/3/")
    assert url_catcher.opened == ["https://docs.python.org/3/"]
    card.open_link("file:///etc/passwd", card.content())
    card.open_link("ftp://example.com/x", card.content())
    assert url_catcher.opened == ["https://docs.python.org/3/"]


# -- edit and regenerate -------------------------------------------------------------------


def test_edit_then_save_emits_the_position_and_new_text(view, qtbot):
    view.set_messages([message(0, "user", "first question"), message(1, "assistant", "first answer"),
                       message(2, "user", "Waht is 2+2?"), message(3, "assistant", "5")])
    card = view.messages()[2]
    qtbot.mouseClick(card.edit_button, Qt.MouseButton.LeftButton)
    assert shown(card.editor_panel) and not shown(card.body)
    assert card.editor.toPlainText() == "Waht is 2+2?"
    card.editor.setPlainText("What is 2+2?")
    with qtbot.waitSignal(view.edit_submitted) as signal:
        qtbot.mouseClick(card.save_button, Qt.MouseButton.LeftButton)
    assert signal.args == [2, "What is 2+2?"]
    assert not shown(card.editor_panel) and shown(card.body)


def test_cancelled_edit_emits_nothing_and_keeps_the_text(view, qtbot):
    card = view.append_message(message(0, "user", "keep me"))
    qtbot.mouseClick(card.edit_button, Qt.MouseButton.LeftButton)
    card.editor.setPlainText("changed")
    with qtbot.assertNotEmitted(view.edit_submitted):
        qtbot.mouseClick(card.cancel_button, Qt.MouseButton.LeftButton)
    assert card.content() == "keep me" and not shown(card.editor_panel)


def test_only_user_messages_can_be_edited(view):
    view.set_messages([message(0, "user", "q"), message(1, "assistant", "a")])
    assert [shown(card.edit_button) for card in view.messages()] == [True, False]


def test_regenerate_is_offered_on_the_last_answer_only(view, qtbot):
    view.set_messages([message(0, "user", "q1"), message(1, "assistant", "a1"),
                       message(2, "user", "q2"), message(3, "assistant", "a2")])
    assert [shown(card.regenerate_button) for card in view.messages()] == [False, False, False, True]
    with qtbot.waitSignal(view.regenerate_requested):
        qtbot.mouseClick(view.messages()[3].regenerate_button, Qt.MouseButton.LeftButton)

    view.append_message(message(4, "user", "q3"))
    assert not any(shown(card.regenerate_button) for card in view.messages())
    streaming = view.append_message(message(5, "assistant", "", state="streaming"))
    assert not shown(streaming.regenerate_button)
    assert not view.messages()[0].edit_button.isEnabled()  # no edits while an answer streams
    view.finish_streaming(METRICS, "complete")
    assert [shown(card.regenerate_button) for card in view.messages()] == [False] * 5 + [True]
    assert view.messages()[0].edit_button.isEnabled()


# -- reasoning and streaming -------------------------------------------------------------------


def test_reasoning_is_collapsed_until_toggled(view, qtbot):
    card = view.append_message(message(1, "assistant", "<think>Because 2 and 2 make 4.</think>\n\nIt is **4**."))
    assert shown(card.reasoning_toggle) and card.reasoning_toggle.text() == "Reasoning"
    assert not shown(card.reasoning_body)
    assert "<strong>4</strong>" in card.body.html() and "Because" not in card.body.html()
    qtbot.mouseClick(card.reasoning_toggle, Qt.MouseButton.LeftButton)
    assert shown(card.reasoning_body) and "Because 2 and 2 make 4." in card.reasoning_body.html()
    qtbot.mouseClick(card.reasoning_toggle, Qt.MouseButton.LeftButton)
    assert not shown(card.reasoning_body)


def test_unclosed_think_block_shows_thinking_while_streaming(view):
    card = view.append_message(message(1, "assistant", "", state="streaming"))
    view.update_streaming("<think>Let me")
    assert card.reasoning_toggle.text() == "Thinking…" and card.body.html() == ""
    view.update_streaming("<think>Let me see.</think>\n\nDone.")
    assert card.reasoning_toggle.text() == "Reasoning" and "Done." in card.body.html()


def test_streaming_updates_change_the_displayed_text(view):
    card = view.append_message(message(1, "assistant", "", state="streaming"))
    assert shown(card.status_label)  # the "writing…" indicator
    view.update_streaming("Hel")
    assert "Hel" in card.body.html()
    view.update_streaming("Hello **there**")
    assert "Hello <strong>there</strong>" in card.body.html()
    view.finish_streaming(METRICS, "complete")
    assert not shown(card.status_label)
    assert view.message_texts() == ["Hello **there**"]


def test_a_long_answer_re_renders_only_its_last_piece(view, monkeypatch):
    card = view.append_message(message(1, "assistant", "", state="streaming"))
    paragraph = "A sentence of a long answer, with *some* emphasis. " * 8 + "\n\n"
    view.update_streaming(paragraph * 30)  # about 12,000 characters
    settle()
    rendered = []
    original = RichLabel.setText
    monkeypatch.setattr(RichLabel, "setText", lambda label, html: (rendered.append(html), original(label, html)))
    view.update_streaming(paragraph * 30 + "More")
    assert len(card.body.findChildren(RichLabel)) > 3
    assert len(rendered) == 1 and "More" in rendered[0] and len(rendered[0]) < len(card.body.html()) / 3


def test_finished_answer_shows_its_figures_with_details_in_the_tooltip(view):
    card = view.append_message(message(1, "assistant", "", state="streaming"))
    view.update_streaming("Answer.")
    view.finish_streaming(METRICS, "complete")
    assert shown(card.details_label)
    assert card.details_label.text() == "128 tokens · 31.2 tok/s · TTFT 0.42 s · prefill 380 tok/s · SmolLM2-135M"
    tooltip = card.details_label.toolTip()
    assert "Last token latency: 32.1 ms" in tooltip and "Context: 508 of 2,048 tokens" in tooltip


@pytest.mark.parametrize("state, note", [
    ("cancelled", "Stopped"),
    ("interrupted", "Interrupted — the app closed while this answer was being written"),
])
def test_unfinished_answers_say_why(view, state, note):
    card = view.append_message(message(1, "assistant", "Half an ans", state=state, metrics={"decode_tokens": 3}))
    assert shown(card.note) and card.note.text() == note
    assert "Half an ans" in card.body.html()


def test_an_error_is_shown_with_the_text_kept(view):
    card = view.append_message(message(1, "assistant", "", state="streaming"))
    view.update_streaming("Partial text")
    view.finish_streaming({"decode_tokens": 2, "error": "The model file is truncated; download it again."}, "error")
    assert shown(card.note) and card.note.text() == "The model file is truncated; download it again."
    assert card.note.property("kind") == "error"
    assert "Partial text" in card.body.html()


# -- the list ------------------------------------------------------------------------------------


def test_truncate_from_removes_that_message_the_later_ones_and_their_notices(view):
    view.set_messages([message(0, "user", "m0"), message(1, "assistant", "m1")])
    view.show_notice("kept: before position 2")
    view.append_message(message(2, "user", "m2"))
    view.show_notice("removed: after position 2")
    view.append_message(message(3, "assistant", "m3"))
    view.truncate_from(2)
    settle()
    assert [card.position for card in view.messages()] == [0, 1]
    notices = [label.text() for label in view.widget().findChildren(QLabel, "InfoBanner") if shown(label)]
    assert notices == ["kept: before position 2"]
    assert shown(view.messages()[1].regenerate_button)


def test_placeholder_shows_only_when_there_are_no_messages(view):
    view.set_placeholder("SmolLM2-135M\nType a message to start")
    assert shown(view.placeholder) and view.placeholder.text() == "SmolLM2-135M\nType a message to start"
    assert not view.has_messages()
    view.append_message(message(0, "user", "hi"))
    assert not shown(view.placeholder) and view.has_messages()
    view.clear()
    assert shown(view.placeholder) and view.messages() == [] and not view.has_messages()


def test_dark_mode_recolours_code(view):
    card = view.append_message(message(1, "assistant", CODE_ANSWER))
    light = card.body.html()
    view.set_dark(True)
    assert card.body.html() != light and "#282c34" in card.body.html()


def test_follows_the_stream_only_while_the_reader_is_at_the_bottom(view):
    view.set_messages([message(i, "user" if i % 2 == 0 else "assistant", f"Message {i}. " * 40) for i in range(20)])
    view.append_message(message(20, "assistant", "", state="streaming"))
    scrollbar = view.verticalScrollBar()
    text = ""
    for _ in range(5):
        text += "More streamed text. " * 30 + "\n\n"
        view.update_streaming(text)
        settle()
        assert scrollbar.maximum() > 0 and scrollbar.value() == scrollbar.maximum()

    scrollbar.setValue(0)  # the reader scrolls up to read
    before = scrollbar.maximum()
    for _ in range(3):
        text += "Even more text. " * 30 + "\n\n"
        view.update_streaming(text)
        settle()
    assert scrollbar.maximum() > before and scrollbar.value() == 0

    scrollbar.setValue(scrollbar.maximum())  # back at the bottom: follow again
    view.update_streaming(text + "The end. " * 40)
    settle()
    assert scrollbar.value() == scrollbar.maximum()


# -- performance ---------------------------------------------------------------------------------


def long_conversation(count: int) -> list[dict]:
    """A conversation of short questions and answers mixing prose, lists and code."""
    prose = "A paragraph with **bold**, *emphasis*, `inline code` and a [link](https://example.com). " * 4
    code = "```python\n" + "".join(f"def f{i}(x):\n    return x * {i}\n" for i in range(12)) + "```\n"
    return [
        message(i, "user", f"Question {i}: {prose[:160]}") if i % 2 == 0 else
        message(i, "assistant", prose + "\n\n- one\n- two\n\n" + (code if i % 4 == 1 else prose), metrics=METRICS)
        for i in range(count)
    ]


def test_two_hundred_messages_load_and_scroll_smoothly(view, record_property):
    view.resize(1000, 800)
    settle()
    start = time.perf_counter()
    view.set_messages(long_conversation(200))
    settle()
    load = time.perf_counter() - start

    scrollbar = view.verticalScrollBar()
    steps = []
    for value in range(scrollbar.maximum(), -1, -scrollbar.pageStep() // 4):
        start = time.perf_counter()
        scrollbar.setValue(value)
        QApplication.processEvents()
        steps.append(time.perf_counter() - start)
    record_property("load_s", round(load, 3))
    record_property("scroll_steps", len(steps))
    record_property("scroll_max_ms", round(max(steps) * 1000, 1))
    print(f"\n200 messages: set_messages + first layout {load:.2f} s; {len(steps)} scroll steps, "
          f"longest {max(steps) * 1000:.1f} ms, mean {sum(steps) / len(steps) * 1000:.1f} ms")
    assert len(view.messages()) == 200 and len(steps) > 100
    assert max(steps) < 0.1


def test_the_canvas_minimum_width_does_not_grow_with_the_view(qtbot):
    """Content wider than the column: if the minimum counted the centring margins, which
    grow with the width, the scroll area would widen the canvas to its minimum, which would
    grow the minimum, inside its resize handler, until the stack overflowed."""
    from app.widgets.chat_view import COLUMN_WIDTH

    view = ChatView()
    qtbot.addWidget(view)
    wide = QLabel("wide")
    wide.setMinimumWidth(COLUMN_WIDTH + 200)
    view._list.addWidget(wide)
    view.show()
    minimums = []
    for width in (1400, 2400):
        view.resize(width, 600)
        qtbot.wait(20)
        minimums.append(view.widget().layout().totalMinimumSize().width())
    assert minimums[0] == minimums[1] <= COLUMN_WIDTH + 200 + 2 * 16
    assert view.widget().width() <= max(view.viewport().width(), minimums[0])
