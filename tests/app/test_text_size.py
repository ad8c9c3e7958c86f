"""One text size for the whole window: Ctrl+Plus and Ctrl+0 change menus, sidebar, buttons, metrics and
messages together, and the metrics panel reflows instead of overlapping."""

import pytest

from PySide6.QtWidgets import QLabel, QWidget

from tests.app.conftest import answer

pytestmark = [pytest.mark.any_model, pytest.mark.usefixtures("restore_look")]

SPECULATIVE_METRICS = {
    "decode_tokens": 1234, "last_token_latency_s": 0.02, "time_to_first_token_s": 1.42, "prefill_tokens": 12345,
    "prefill_tok_s": 1234.5, "context_used": 123456, "context_size": 131072, "acceptance_rate": 0.72,
    "mean_accepted_length": 2.9, "decode_tok_s": 123.4,
}


def font_sizes(window) -> dict[str, float]:
    """The point size of every widget of the window, by a path of object names and classes."""
    sizes = {}
    for index, widget in enumerate(window.findChildren(QWidget)):
        widget.ensurePolished()
        sizes[f"{index}:{type(widget).__name__}#{widget.objectName()}"] = widget.font().pointSizeF()
    return sizes


def press(window, action: str) -> None:
    """What the shortcut does (Ctrl++ is View > Larger text, Ctrl+0 View > Actual size)."""
    window.menu_actions[action].trigger()


def test_larger_three_times_then_actual_size_brings_every_widget_back(qtbot, window):
    answer(qtbot, window, lambda: window.controller.send("Hello"))  # a message card, its figures and buttons
    window.apply_look()  # as `sprig` does when it opens the window
    before = font_sizes(window)
    menu_before = window.menuBar().font().pointSizeF()
    for _ in range(3):
        press(window, "larger")
    assert window.controller.settings.text_scale == 130
    larger = font_sizes(window)
    grown = [name for name in before if larger[name] > before[name] * 1.25]
    assert len(grown) == len(before), [(n, before[n], larger[n]) for n in sorted(set(before) - set(grown))][:6]  # everything grew, by 30%
    press(window, "text_reset")
    assert window.controller.settings.text_scale == 100
    assert font_sizes(window) == before
    assert window.menuBar().font().pointSizeF() == menu_before


def test_secondary_text_stays_in_proportion(qtbot, window):
    answer(qtbot, window, lambda: window.controller.send("Hello"))
    card = window.chat_view.messages()[-1]
    window.change_text_size(50)
    ratio = card.details_label.font().pointSizeF() / card.body.font().pointSizeF()
    assert ratio == pytest.approx(0.9, abs=0.02)
    assert window.metrics.rate.font().pointSizeF() > 2 * window.metrics.first_token.font().pointSizeF()


def overlapping(labels: list[QLabel]) -> list[tuple[str, str]]:
    """Pairs of visible labels whose rectangles (in the panel) intersect."""
    shown = [label for label in labels if label.isVisible()]
    rects = [(label.text(), label.geometry().translated(label.parentWidget().mapTo(label.window(), label.pos()) - label.pos()))
             for label in shown]
    return [(a, b) for i, (a, ra) in enumerate(rects) for (b, rb) in rects[i + 1:] if ra.intersects(rb)]


@pytest.mark.parametrize("scale", [100, 160, 200])
def test_metrics_reflow_at_large_text_in_a_narrow_panel(qtbot, window, scale):
    window.change_text_size(0)
    window.change_text_size(scale - 100)
    panel = window.metrics
    panel.update_metrics(SPECULATIVE_METRICS)
    panel.finish_answer(SPECULATIVE_METRICS)
    window.findChild(type(window.centralWidget())).setSizes([200, 600, 180])
    qtbot.waitUntil(lambda: panel.width() <= 200)
    labels = panel.findChildren(QLabel)
    qtbot.wait(50)
    assert overlapping(labels) == []
    for label in labels:  # every figure whole: wrapped onto more lines where it must, never cut
        if label.isVisible() and label.wordWrap():
            assert label.height() >= label.heightForWidth(label.width()), label.text()
            assert label.geometry().right() <= panel.contentsRect().right() + 1, label.text()
    assert "72% accepted" in panel.speculation.text()
