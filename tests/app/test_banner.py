"""Long notices collapse to one line with a Details disclosure whose box scrolls."""

import pytest
from gguf import GGMLQuantizationType

from app.widgets.banner import DETAILS_LINES, Banner
from tests.app.conftest import LOAD_TIMEOUT_MS
from tests.gguf_factory import write_tiny_model


@pytest.fixture
def banner(qtbot):
    widget = Banner("InfoBanner")
    qtbot.addWidget(widget)
    widget.resize(700, 40)
    widget.show()
    return widget


def one_line_height(banner: Banner) -> int:
    return banner.label.fontMetrics().height()


def test_thirty_lines_take_one_line_until_details_open_and_then_scroll(qtbot, banner):
    lines = [f"blk.{i}.ffn_up.weight is TQ2_0, which the cpu backend has no kernel for" for i in range(30)]
    banner.show_text("\n".join(["Model: 30 tensors were converted at load.", *lines]))
    qtbot.waitUntil(lambda: banner.height() < 3 * one_line_height(banner) + 20)
    assert banner.label.text().startswith("Model: 30 tensors were converted at load.")
    assert "+30 more lines" in banner.label.text()
    assert banner.details_button.isVisible() and not banner.details.isVisible()
    assert banner.text().count("\n") == 30  # nothing is lost

    banner.details_button.click()
    assert banner.details.isVisible()
    qtbot.waitUntil(lambda: banner.details.verticalScrollBar().maximum() > 0)  # the details scroll...
    lines_shown = banner.details.height() / banner.details.fontMetrics().lineSpacing()
    assert lines_shown <= DETAILS_LINES + 1  # ...in a box of a few lines
    assert banner.details.toPlainText() == banner.text()
    banner.details_button.click()
    assert not banner.details.isVisible()


def test_a_short_notice_has_no_details_and_added_notices_join_the_details(qtbot, banner):
    banner.show_text("Loading was cancelled.")
    assert banner.label.text() == "Loading was cancelled." and not banner.details_button.isVisible()
    banner.add_text("The template was guessed.")
    assert banner.label.text().startswith("Loading was cancelled.") and "+1 more line" in banner.label.text()
    assert banner.details_button.isVisible()
    banner.hide()
    banner.add_text("Fresh news.")  # a hidden banner starts over
    assert banner.text() == "Fresh news."


def test_a_long_single_line_is_cut_short_and_offers_details(qtbot, banner):
    banner.show_text("word " * 200)
    qtbot.waitUntil(lambda: banner.label.is_elided())
    assert banner.details_button.isVisible()
    assert banner.height() < 3 * one_line_height(banner) + 20


@pytest.mark.any_model
def test_converted_tensors_give_one_notice_line_over_the_chat(qtbot, window, tmp_path):
    from tests.engine.test_cpu_backend_loading import nvfp4_blocks  # NVFP4: a type without a cpu kernel

    path = write_tiny_model(tmp_path / "nvfp4.gguf", arch="qwen3", d_model=256, n_heads=4, head_dim=64, d_ff=256,
                            tensor_type=GGMLQuantizationType.NVFP4, quantize=nvfp4_blocks)
    with qtbot.waitSignal(window.controller.models.model_loaded, timeout=LOAD_TIMEOUT_MS):
        window.controller.models.load(path)
    info = window.info_banner
    qtbot.waitUntil(info.isVisible)
    assert "tensors were converted at load" in info.label.text()
    assert info.text().count("converted to Q8_0 at load") >= 8  # one line per tensor, in the details
    qtbot.waitUntil(lambda: info.height() < 3 * one_line_height(info) + 20)
