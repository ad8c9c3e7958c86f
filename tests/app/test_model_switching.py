"""Loading another model: the previous one stays until the new one is ready (or the app says it went),
and switching models does not pile up memory."""

import psutil
import pytest

from backends.selection import planned_backend
from engine.bundled import bundled_model
from engine.model_info import read_model_info
from tests.app.conftest import LOAD_TIMEOUT_MS, answer, load
from tests.gguf_factory import write_tiny_model


def cancel_at_first_progress(qtbot, window, path) -> None:
    """Start loading `path` and cancel it as soon as it reports progress; wait until it has ended."""
    controller = window.controller
    controller.models.load_progress.connect(lambda *_: controller.cancel())
    with qtbot.waitSignal(controller.busy_changed, check_params_cb=lambda busy: not busy, timeout=LOAD_TIMEOUT_MS):
        assert controller.models.load(path)
    controller.models.load_progress.disconnect()


@pytest.mark.any_model
def test_cancelling_a_load_keeps_the_previous_model(qtbot, window):
    before = window.controller.model_info
    cancel_at_first_progress(qtbot, window, bundled_model("smollm2").path)
    assert window.controller.loaded is not None and window.controller.model_info == before
    assert window.model_bar.model_button.full_text() == before.name
    assert "cancelled" in window.info_banner.text()
    _metrics, state = answer(qtbot, window, lambda: window.controller.send("Still there?"))
    assert state == "complete"


@pytest.mark.any_model
def test_where_both_do_not_fit_the_previous_goes_first_and_a_cancel_says_so(qtbot, window, monkeypatch):
    smollm2 = bundled_model("smollm2").path
    settings = window.controller.settings
    info = read_model_info(smollm2)
    needed = info.memory_needed(settings.context_length, planned_backend(settings.backend))
    monkeypatch.setattr("engine.opening.available_memory", lambda: needed - 1)  # room for one model only
    previous = window.controller.model_info.name
    cancel_at_first_progress(qtbot, window, smollm2)
    assert window.controller.loaded is None and window.controller.model_info is None
    assert window.model_bar.model_button.full_text() == "No model loaded"
    notice = window.info_banner.text()
    assert f"{previous} was unloaded to make room for {info.name}" in notice and "no model is loaded" in notice


def rss_mb() -> float:
    return psutil.Process().memory_info().rss / 1e6


def test_switching_models_ten_times_returns_to_the_memory_of_one_load(qtbot, window, tmp_path):
    """SmolLM2 (the window's) and a tiny model in turn, each answering; RSS ends within 10% of one load."""
    smollm2 = bundled_model("smollm2").path
    tiny = write_tiny_model(tmp_path / "tiny.gguf", arch="qwen3", **{"qwen3.context_length": 4096})
    answer(qtbot, window, lambda: window.controller.send("Name a colour."))
    one_load = rss_mb()
    for _ in range(10):
        load(qtbot, window, tiny)
        load(qtbot, window, smollm2)
        answer(qtbot, window, lambda: window.controller.send("Name a colour."))
    assert rss_mb() < one_load * 1.10, (one_load, rss_mb())
