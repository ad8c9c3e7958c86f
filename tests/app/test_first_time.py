"""Issue 10, the app for a first-time user: what the window says and does, offscreen."""

from dataclasses import replace

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QAbstractButton, QLabel

from engine.bundled import bundled_model
from tests.app.conftest import LOAD_TIMEOUT_MS, answer, close_window, load, make_window, quick_settings
from tests.gguf_factory import write_tiny_model


def test_a_guessed_template_and_a_base_model_are_told_once_and_cleared(qtbot, tmp_path):
    bare = write_tiny_model(tmp_path / "tiny-qwen3-base.gguf", "qwen3", **{"tokenizer.chat_template": None})
    window = make_window(qtbot, tmp_path / "data", quick_settings(tmp_path))
    try:
        notices: list[str] = []
        window.controller.model_notice.connect(notices.append)
        load(qtbot, window, bare)
        qtbot.waitUntil(lambda: len(notices) >= 1)
        text = window.info_banner.label.text()
        assert window.info_banner.isVisible()
        assert "no chat template" in text and "ChatML" in text and "base model" in text
        assert len([n for n in notices if "no chat template" in n]) == 1
        # A model with its own template: the notice about the last one goes away.
        load(qtbot, window, bundled_model("smollm2").path)
        assert not window.info_banner.isVisible()
    finally:
        close_window(window)


def inside_window(window, widget) -> bool:
    """Whether `widget` is shown, with some size, wholly within the window's area."""
    top_left = widget.mapTo(window, widget.rect().topLeft())
    area = widget.rect().translated(top_left)
    return widget.isVisible() and area.width() > 5 and area.height() > 5 and window.rect().contains(area)


def test_the_window_fits_a_laptop_screen(qtbot, window):
    long_name = "Very-Long-Model-Name-Instruct-v0.3-With-Many-Parts-" * 4
    info = replace(window.controller.model_info, name=long_name)
    for width, height in ((1366, 768), (1280, 720)):
        window.resize(width, height)
        qtbot.wait(50)
        window.model_bar.set_model(info)
        window.model_bar.set_backend("numpy", "CPU, " + "a long device description " * 6, [])
        window.model_bar.set_loading(True)
        qtbot.wait(50)
        assert window.size().width() == width and window.size().height() == height  # nothing grew it
        window.model_bar.set_loading(False)
        qtbot.wait(50)
        hint = window.minimumSizeHint()
        assert hint.width() <= 1000 and hint.height() <= 600
        assert window.size().width() == width and window.size().height() == height
        for widget in (window.input, window.send_button, window.metrics, window.metrics.rate,
                       window.model_bar.model_button):
            assert inside_window(window, widget), widget
        # The long texts are cut short, and whole in their tooltips.
        button = window.model_bar.model_button
        assert "…" in button.text() and long_name in button.toolTip()
        assert window.model_bar.details.toolTip() == window.model_bar.details.text()
        assert window.model_bar.backend_label.is_elided()


def visible_texts(window) -> list[str]:
    """The texts of every label and button the user can see."""
    widgets = window.findChildren(QLabel) + window.findChildren(QAbstractButton)
    return [w.text() for w in widgets if w.isVisible()]


def test_loading_tells_one_story_and_cancel_is_not_an_error(qtbot, tmp_path):
    window = make_window(qtbot, tmp_path / "data", quick_settings(tmp_path))
    try:
        gemma = bundled_model("gemma3").path
        with qtbot.waitSignal(window.controller.load_progress, timeout=LOAD_TIMEOUT_MS,
                              check_params_cb=lambda fraction, _stage: fraction > 0.2):
            window.add_model(str(gemma))
        bar = window.model_bar.progress
        centre = window.chat_view.placeholder.text()
        assert window.chat_view.placeholder.isVisible()
        assert gemma.name in centre and f"{round(100 * bar.value() / bar.maximum())}%" in centre
        assert not [text for text in visible_texts(window) if "No model loaded" in text]
        assert bar.alignment() & Qt.AlignmentFlag.AlignHCenter  # the percentage sits inside the bar
        assert not window.model_bar.unload_button.isEnabled()
        with qtbot.waitSignal(window.controller.model_unloaded, timeout=LOAD_TIMEOUT_MS):
            window.model_bar.cancel_button.click()
        assert not window.error_banner.isVisible()
        assert window.info_banner.isVisible() and "cancelled" in window.info_banner.label.text()
    finally:
        close_window(window)


def test_loading_over_a_chat_says_so_above_it(qtbot, window):
    answer(qtbot, window, lambda: window.controller.send("Hi"))
    with qtbot.waitSignal(window.controller.load_progress, timeout=LOAD_TIMEOUT_MS,
                          check_params_cb=lambda fraction, _stage: fraction > 0.2):
        window.add_model(str(bundled_model("gemma3").path))
    assert window.loading_label.isVisible() and "gemma-3-270m" in window.loading_label.text()
    with qtbot.waitSignal(window.controller.model_unloaded, timeout=LOAD_TIMEOUT_MS):
        window.controller.cancel()
    assert not window.loading_label.isVisible()


def test_backend_notes_warn_only_when_a_gpu_idles(qtbot, window):
    reasons = list(window.controller.loaded.backend_notes)
    assert reasons  # the other backends' stories are there to tell
    window._gpu = None  # a PC without a GPU
    window.controller.backend_changed.emit("numpy", "CPU", reasons)
    label = window.model_bar.backend_label
    assert "⚠" not in label.text() and not label.property("warning")
    assert all(reason in label.toolTip() for reason in reasons)
    assert window.metrics.notes.isHidden()
    window._gpu = "an NVIDIA GPU"
    window.controller.backend_changed.emit("numpy", "CPU", reasons)
    assert label.text().startswith("⚠") and label.property("warning")
    assert "NVIDIA GPU" in label.toolTip() and not window.metrics.notes.isHidden()
