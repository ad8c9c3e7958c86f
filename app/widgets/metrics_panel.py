"""The live metrics panel: speed, latency, context and memory of the current answer."""

from collections import deque

import psutil
from PySide6.QtCore import Qt, QTimer
from PySide6.QtGui import QHideEvent, QShowEvent
from PySide6.QtWidgets import (
    QFrame,
    QGridLayout,
    QHBoxLayout,
    QLabel,
    QProgressBar,
    QScrollArea,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app.backend_status import BackendStatus
from app.widgets.sparkline import Sparkline
from engine.model_info import format_bytes

NONE = "—"
SMOOTHING = 5  # tokens averaged into the "right now" rate


def format_rate(tok_s: float | None) -> str:
    """Tokens per second: one decimal below 100 ("23.4"), whole above ("1,250")."""
    if tok_s is None:
        return NONE
    return f"{tok_s:,.1f}" if tok_s < 100 else f"{tok_s:,.0f}"


def format_duration(seconds: float | None) -> str:
    """A short time: "420 ms" below a second, "1.42 s" above."""
    if seconds is None:
        return NONE
    return f"{seconds * 1000:.0f} ms" if seconds < 1 else f"{seconds:.2f} s"


def format_drafts(metrics: dict) -> str:
    """Speculative decoding's figures: "72% accepted · 2.9 per check"; "—" when nothing was drafted."""
    rate, length = metrics.get("acceptance_rate"), metrics.get("mean_accepted_length")
    if rate is None or length is None:
        return NONE
    return f"{rate:.0%} accepted · {length:.1f} per check"


class MetricsPanel(QFrame):
    """A collapsible panel of live generation figures, fed from the GUI thread.

    Per answer: `start_answer()`, then `update_metrics(m)` for each throttled event
    (m holds engine.generation.Metrics.as_dict() keys; any value may be None), then
    `finish_answer(m)`. The big number is the rate right now: the tokens over the
    summed latencies of the last SMOOTHING tokens. Process memory refreshes every
    second while the panel is shown and expanded.

    The child widgets are attributes (header, body, rate, caption, sparkline,
    first_token, prefill, generated, context, speculation, context_bar, memory, backend, notes)
    for styling and tests; only the methods change them.
    """

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("MetricsPanel")
        self._latencies: deque[float] = deque(maxlen=SMOOTHING)
        self._decode_tokens = 0
        self._process = psutil.Process()

        self.header = QToolButton()
        self.header.setObjectName("MetricsHeader")
        self.header.setAccessibleName("Fold or unfold the metrics")
        self.header.clicked.connect(lambda: self.set_collapsed(not self.is_collapsed()))

        self.rate = QLabel(NONE, objectName="MetricsRate")
        self.caption = QLabel("tok/s", objectName="MetricsCaption", wordWrap=True)
        self.caption.setMinimumWidth(1)
        self.sparkline = Sparkline()
        rate_row = QHBoxLayout()
        rate_row.addWidget(self.rate)
        rate_row.addWidget(self.caption, 0, Qt.AlignmentFlag.AlignBottom)
        rate_row.addStretch()

        grid = QGridLayout()
        grid.setHorizontalSpacing(12)
        grid.setColumnStretch(1, 1)
        self.first_token = self._add_row(grid, "First token")
        self.prefill = self._add_row(grid, "Prefill")
        self.generated = self._add_row(grid, "Generated")
        self.context = self._add_row(grid, "Context")
        self.speculation = self._add_row(grid, "Drafts")
        self.speculation.setToolTip(
            "Speculative decoding: the share of drafted tokens the model accepted, and how many it accepted per check"
        )
        self.context_bar = QProgressBar(textVisible=False)
        self.context_bar.setObjectName("ContextBar")
        self.context_bar.setFixedHeight(4)
        self.context_bar.setAccessibleName("Context used")
        grid.addWidget(self.context_bar, grid.rowCount(), 0, 1, 2)
        self.memory = self._add_row(grid, "Memory")
        self.backend = self._add_row(grid, "Backend")
        self.notes = QLabel(objectName="MetricsWarning", wordWrap=True, visible=False)

        figures = QWidget()
        figures.setObjectName("MetricsFigures")
        body = QVBoxLayout(figures)
        body.setContentsMargins(0, 0, 0, 0)
        body.addLayout(rate_row)
        body.addWidget(self.sparkline)
        body.addLayout(grid)
        body.addWidget(self.notes)
        body.addStretch()
        # Taller than the window (large text, a low window), the figures scroll rather than squeeze.
        self.body = QScrollArea()
        self.body.setWidgetResizable(True)
        self.body.setFrameShape(QFrame.Shape.NoFrame)
        self.body.setObjectName("MetricsBody")
        self.body.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.body.setWidget(figures)

        layout = QVBoxLayout(self)
        layout.setContentsMargins(10, 6, 10, 10)
        layout.addWidget(self.header, 0, Qt.AlignmentFlag.AlignLeft)
        layout.addWidget(self.body, 1)
        layout.addStretch()  # keeps the header at the top while the body is folded away

        self._memory_timer = QTimer(self, interval=1000)
        self._memory_timer.timeout.connect(self._refresh_memory)
        self.clear()

    @staticmethod
    def _add_row(grid: QGridLayout, key: str) -> QLabel:
        """Append a "key  value" row to `grid`; return the value label, which wraps its text."""
        row = grid.rowCount()
        grid.addWidget(QLabel(key, objectName="MetricsKey"), row, 0, Qt.AlignmentFlag.AlignTop)
        value = QLabel(NONE, wordWrap=True)  # a long figure wraps in a narrow panel or at a large text size
        value.setMinimumWidth(1)
        grid.addWidget(value, row, 1)
        return value

    # ---- collapsing -------------------------------------------------------------

    def is_collapsed(self) -> bool:
        """Whether only the header shows."""
        return self.body.isHidden()

    def set_collapsed(self, collapsed: bool) -> None:
        """Hide or show everything below the header."""
        self.body.setHidden(collapsed)
        self._update_header()
        self._sync_memory_timer()

    def _update_header(self) -> None:
        """The header names the state; collapsed, it also keeps the rate in sight.

        An empty rate ("—") is drawn muted, so it does not look like a figure.
        """
        empty = self.rate.text() == NONE
        if self.rate.property("empty") != empty:
            self.rate.setProperty("empty", empty)
            self.rate.style().unpolish(self.rate)
            self.rate.style().polish(self.rate)
        if not self.is_collapsed():
            self.header.setText("Metrics ▾")
        elif self.rate.text() == NONE:
            self.header.setText("Metrics ▸")
        else:
            self.header.setText(f"Metrics ▸   {self.rate.text()} {self.caption.text()}")

    # ---- memory -----------------------------------------------------------------

    def showEvent(self, event: QShowEvent) -> None:
        """Start refreshing the memory figure."""
        super().showEvent(event)
        self._sync_memory_timer()

    def hideEvent(self, event: QHideEvent) -> None:
        """Stop refreshing the memory figure."""
        super().hideEvent(event)
        self._memory_timer.stop()

    def _sync_memory_timer(self) -> None:
        """Run the memory timer only while the figure can be seen; refresh on start."""
        if self.isVisible() and not self.is_collapsed():
            if not self._memory_timer.isActive():
                self._refresh_memory()
                self._memory_timer.start()
        else:
            self._memory_timer.stop()

    def _refresh_memory(self) -> None:
        """Show this process's resident memory."""
        self.memory.setText(format_bytes(self._process.memory_info().rss))

    # ---- figures ----------------------------------------------------------------

    def set_backend(self, status: BackendStatus) -> None:
        """Show the backend in use (details in its tooltip); a warning only for an unused GPU."""
        self.backend.setText(status.summary)
        self.backend.setToolTip(status.details)
        self.notes.setText(f"⚠ {status.warning}" if status.warning else "")
        self.notes.setToolTip(status.details)
        self.notes.setVisible(bool(status.warning))

    def clear(self) -> None:
        """Blank every figure of the answer (the backend and memory stay)."""
        self._latencies.clear()
        self._decode_tokens = 0
        self.sparkline.clear()
        for label in (self.rate, self.first_token, self.prefill, self.generated, self.context, self.speculation):
            label.setText(NONE)
        self.caption.setText("tok/s")
        self.context_bar.setRange(0, 1)
        self.context_bar.setValue(0)
        self._update_header()

    def start_answer(self) -> None:
        """Begin a new answer: blank the figures and the plot (what `clear` does, named for the caller)."""
        self.clear()

    def update_metrics(self, metrics: dict) -> None:
        """Show the figures of the answer so far; cheap enough for 30 calls a second."""
        decode_tokens = metrics.get("decode_tokens") or 0
        latency = metrics.get("last_token_latency_s")
        if decode_tokens > self._decode_tokens and latency:
            self._latencies.append(latency)
            now = len(self._latencies) / sum(self._latencies)
            self.rate.setText(format_rate(now))
            self.sparkline.append(now)
        self._decode_tokens = decode_tokens

        self.first_token.setText(format_duration(metrics.get("time_to_first_token_s")))
        prefill_tokens = metrics.get("prefill_tokens") or 0
        prefill_rate = metrics.get("prefill_tok_s")
        prefill = f"{prefill_tokens:,} tokens"
        self.prefill.setText(prefill if prefill_rate is None else f"{prefill} · {format_rate(prefill_rate)} tok/s")
        self.generated.setText(f"{decode_tokens:,} tokens")
        self.speculation.setText(format_drafts(metrics))

        used, size = metrics.get("context_used") or 0, metrics.get("context_size") or 0
        self.context.setText(f"{used:,} / {size:,}" if size else f"{used:,}")
        self.context_bar.setRange(0, max(size, 1))
        self.context_bar.setValue(min(used, max(size, 1)))
        self._update_header()

    def finish_answer(self, metrics: dict) -> None:
        """Show the final figures; the big number becomes the answer's average rate."""
        self.update_metrics(metrics)
        if metrics.get("decode_tok_s") is not None:
            self.rate.setText(format_rate(metrics["decode_tok_s"]))
            self.caption.setText("tok/s average")
            self._update_header()
