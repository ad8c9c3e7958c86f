"""The live metrics panel and its sparkline."""

import re

import psutil
import pytest
from PySide6.QtCore import Qt

from app.backend_status import backend_status, gpu_present
from app.widgets.metrics_panel import MetricsPanel
from app.widgets.sparkline import Sparkline

LATENCIES = [0.05, 0.04, 0.05, 0.025, 0.04, 0.02, 0.05]


def metrics(step: int, **changes) -> dict:
    """Metrics.as_dict() of an answer after `step` decoded tokens."""
    figures = {
        "prefill_tokens": 1234,
        "prefill_tok_s": 812.57,
        "time_to_first_token_s": 0.4123,
        "decode_tokens": step,
        "decode_tok_s": 23.456,
        "last_token_latency_s": LATENCIES[step - 1],
        "context_used": 1234 + step,
        "context_size": 4096,
    }
    return figures | changes


@pytest.fixture
def panel(qtbot):
    panel = MetricsPanel()
    qtbot.addWidget(panel)
    panel.start_answer()
    return panel


def test_figures_follow_the_metrics(panel):
    for step in range(1, len(LATENCIES) + 1):
        panel.update_metrics(metrics(step))
    recent = LATENCIES[-5:]  # the rate right now is averaged over the last five tokens
    assert panel.rate.text() == f"{len(recent) / sum(recent):.1f}" == "27.0"
    assert panel.first_token.text() == "412 ms"
    assert panel.prefill.text() == "1,234 tokens · 813 tok/s"
    assert panel.generated.text() == "7 tokens"
    assert panel.context.text() == "1,241 / 4,096"
    assert (panel.context_bar.value(), panel.context_bar.maximum()) == (1241, 4096)


def test_sparkline_gains_a_point_per_new_token_only(panel):
    counts = []
    for step in (1, 2, 2, 3):  # a repeated event (same token count) adds nothing
        panel.update_metrics(metrics(step))
        counts.append(len(panel.sparkline.points()))
    assert counts == [1, 2, 2, 3]
    assert panel.sparkline.points()[0] == pytest.approx(1 / LATENCIES[0])
    panel.start_answer()
    assert panel.sparkline.points() == []
    assert panel.rate.text() == panel.generated.text() == "—"


def test_drafts_show_acceptance_and_accepted_per_check(panel):
    panel.update_metrics(metrics(1))
    assert panel.speculation.text() == "—"  # nothing drafted (plain decoding, or no match yet)
    panel.update_metrics(metrics(2, acceptance_rate=0.725, mean_accepted_length=2.9))
    assert panel.speculation.text() == "72% accepted · 2.9 per check"
    panel.start_answer()
    assert panel.speculation.text() == "—"


def test_missing_figures_show_a_dash(panel):
    panel.update_metrics(
        {
            "prefill_tokens": 0,
            "prefill_tok_s": None,
            "time_to_first_token_s": None,
            "decode_tokens": 0,
            "decode_tok_s": None,
            "last_token_latency_s": None,
            "context_used": 0,
            "context_size": 0,
        }
    )
    assert panel.rate.text() == panel.first_token.text() == "—"
    assert panel.prefill.text() == "0 tokens"
    assert panel.sparkline.points() == []


def test_long_times_are_shown_in_seconds(panel):
    panel.update_metrics(metrics(1, time_to_first_token_s=2.5, prefill_tok_s=45.25))
    assert panel.first_token.text() == "2.50 s"
    assert panel.prefill.text() == "1,234 tokens · 45.2 tok/s"


def test_finish_shows_the_average_rate(panel):
    panel.update_metrics(metrics(1))
    panel.finish_answer(metrics(2))
    assert panel.rate.text() == "23.5"
    assert "average" in panel.caption.text()


def test_clear_blanks_the_answer_but_keeps_the_backend(panel):
    panel.set_backend(backend_status("numpy", "CPU", []))
    panel.update_metrics(metrics(1))
    panel.clear()
    assert panel.context.text() == panel.first_token.text() == "—"
    assert panel.context_bar.value() == 0
    assert panel.backend.text() == "numpy · CPU"


def test_header_click_collapses_and_expands(panel, qtbot):
    panel.show()
    panel.update_metrics(metrics(1))
    qtbot.mouseClick(panel.header, Qt.MouseButton.LeftButton)
    assert panel.is_collapsed() and not panel.body.isVisible()
    assert panel.header.text() == "Metrics ▸   20.0 tok/s"  # the rate stays in sight
    qtbot.mouseClick(panel.header, Qt.MouseButton.LeftButton)
    assert not panel.is_collapsed() and panel.body.isVisible()
    assert panel.header.text() == "Metrics ▾"


def test_memory_shows_this_process_while_visible(panel):
    panel.show()
    match = re.fullmatch(r"([\d.]+) (MB|GB)", panel.memory.text())
    assert match, panel.memory.text()
    shown = float(match[1]) * (1e6 if match[2] == "MB" else 1e9)
    rss = psutil.Process().memory_info().rss
    assert 10 * 2**20 < shown and 0.5 * rss < shown < 2 * rss


def test_memory_timer_runs_only_when_it_can_be_seen(panel):
    timer = panel._memory_timer
    assert not timer.isActive()
    panel.show()
    assert timer.isActive()
    panel.set_collapsed(True)
    assert not timer.isActive()
    panel.set_collapsed(False)
    panel.hide()
    assert not timer.isActive()


@pytest.mark.parametrize("backend", ["numpy", "cpu"])
def test_a_cpu_only_pc_is_information_not_a_warning(panel, backend):
    notes = ["cuda: pycuda is not installed", "mlx: not Apple silicon"]
    panel.set_backend(backend_status(backend, "CPU (2 cores)", notes, gpu=None))
    assert panel.backend.text() == f"{backend} · CPU (2 cores)"
    assert panel.notes.isHidden() and "⚠" not in panel.backend.text()
    assert all(note in panel.backend.toolTip() for note in notes)


def test_a_gpu_present_but_unused_stays_a_warning(panel):
    notes = ["cuda: pycuda is not installed", "mlx: not Apple silicon"]
    panel.set_backend(backend_status("numpy", "CPU", notes, gpu="an NVIDIA GPU"))
    assert not panel.notes.isHidden()
    assert "NVIDIA GPU" in panel.notes.text() and "pycuda is not installed" in panel.notes.text()
    panel.set_backend(backend_status("cuda", "NVIDIA H100", [], gpu="an NVIDIA GPU"))
    assert panel.notes.isHidden()


def test_sparkline_halves_its_points_when_full(qtbot):
    line = Sparkline()
    qtbot.addWidget(line)
    values = [float(i) for i in range(Sparkline.CAPACITY)]
    for v in values:
        line.append(v)
    merged = [(a + b) / 2 for a, b in zip(values[0::2], values[1::2])]
    assert line.points() == merged
    line.append(1000.0)  # later values go in pairs now
    assert len(line.points()) == len(merged)
    line.append(2000.0)
    assert line.points() == merged + [1500.0]


def test_sparkline_paints_the_line(qtbot):
    line = Sparkline()
    qtbot.addWidget(line)
    line.resize(100, 40)
    for v in (10, 30, 20):
        line.append(v)
    image = line.grab().toImage()
    highlight = line.palette().highlight().color()
    painted = sum(
        image.pixelColor(x, y).rgb() == highlight.rgb() for x in range(image.width()) for y in range(image.height())
    )
    assert painted > 20


def test_gpu_present_looks_for_the_nvidia_driver(monkeypatch, tmp_path):
    import app.backend_status

    monkeypatch.setattr(app.backend_status.platform, "system", lambda: "Linux")
    monkeypatch.setattr(app.backend_status, "_NVIDIA_SIGNS", (str(tmp_path / "nvidia0"),))
    assert gpu_present() is None
    (tmp_path / "nvidia0").touch()
    assert gpu_present() == "an NVIDIA GPU"
