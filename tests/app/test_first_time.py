"""Issue 10, the app for a first-time user: what the window says and does, offscreen."""

from engine.bundled import bundled_model
from tests.app.conftest import close_window, load, make_window, quick_settings
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
