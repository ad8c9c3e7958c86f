"""One message of the conversation: who wrote it, its rendered text, and what can be done with it.

The body is a `MarkdownView`: rich-text labels fed by `app.markdown_render`, one per
piece of a long text so that a streaming answer re-renders only its last piece. Links
are handled here: `copy-code:N` copies the N-th code block, http(s) links open in the
browser, any other scheme is ignored. An assistant message may start with a `<think>`
block; it is shown in a collapsible "Reasoning" section, collapsed by default and
rendered only when opened. The look comes from the app's stylesheet
(`MessageWidget[role="user"]` …) and from `ChatView`'s stylesheet for the parts named
by objectName below.
"""

from PySide6.QtCore import QEvent, QRect, QSize, Qt, QTimer, QUrl, Signal
from PySide6.QtGui import QCursor, QDesktopServices, QFont, QKeySequence, QResizeEvent, QShortcut
from PySide6.QtWidgets import (
    QApplication, QFrame, QHBoxLayout, QLabel, QPlainTextEdit, QPushButton, QSizePolicy,
    QToolButton, QToolTip, QVBoxLayout, QWidget,
)

from app.markdown_render import COPY_CODE_SCHEME, Segment, code_blocks, render_markdown, segments, split_reasoning
from app.storage import CUT_AT_LIMIT, ended_early

STREAMING, COMPLETE, CANCELLED, INTERRUPTED, ERROR = "streaming", "complete", "cancelled", "interrupted", "error"
NOTES = {
    CANCELLED: "Stopped",
    INTERRUPTED: "Interrupted — the app closed while this answer was being written",
}
CUT_NOTE = "Cut off at the token limit (Max tokens in the settings). Continue writes the rest."
WEB_SCHEMES = ("http", "https")
COPIED_FEEDBACK_MS = 1200
PULSE_MS = 400
HINT_WIDTH = 600  # px, a rich label's width before it has been laid out


def metrics_summary(metrics: dict | None, model: str | None = None) -> str:
    """The one-line figures under an answer: '128 tokens · 31.2 tok/s · TTFT 0.42 s · …'.

    Empty when there are no figures (an answer that failed before its first token).
    """
    metrics = metrics or {}
    figures = [
        ("decode_tokens", "{:d} tokens"),
        ("decode_tok_s", "{:.1f} tok/s"),
        ("time_to_first_token_s", "TTFT {:.2f} s"),
        ("prefill_tok_s", "prefill {:.0f} tok/s"),
        ("acceptance_rate", "drafts {:.0%} accepted"),
    ]
    parts = [fmt.format(metrics[key]) for key, fmt in figures if metrics.get(key) is not None]
    return " · ".join(parts + [model]) if parts and model else " · ".join(parts)


def metrics_tooltip(metrics: dict | None) -> str:
    """Every figure of an answer, one per line, for the details line's tooltip."""
    metrics = metrics or {}
    lines = [
        ("prefill_tokens", "Prompt tokens processed: {:d}"),
        ("prefill_tok_s", "Prefill speed: {:.1f} tok/s"),
        ("time_to_first_token_s", "Time to first token: {:.3f} s"),
        ("decode_tokens", "Tokens generated: {:d}"),
        ("decode_tok_s", "Generation speed: {:.2f} tok/s"),
        ("last_token_latency_s", "Last token latency: {:.1f} ms"),
        ("acceptance_rate", "Drafts accepted: {:.0%}"),
        ("mean_accepted_length", "Accepted per check: {:.2f} tokens"),
    ]
    scale = {"last_token_latency_s": 1000.0}
    text = [fmt.format(metrics[key] * scale.get(key, 1)) for key, fmt in lines if metrics.get(key) is not None]
    if metrics.get("context_used") is not None and metrics.get("context_size"):
        text.append(f"Context: {metrics['context_used']:,} of {metrics['context_size']:,} tokens")
    return "\n".join(text)


def _small_font(widget: QWidget) -> QFont:
    """The widget's font at 90 % size, for secondary text."""
    font = QFont(widget.font())
    font.setPointSizeF(font.pointSizeF() * 0.9)
    return font


def _action_button(text: str, tooltip: str) -> QToolButton:
    """A small, flat button of the message's action row."""
    button = QToolButton()
    button.setObjectName("MessageAction")
    button.setText(text)
    button.setToolTip(tooltip)
    button.setCursor(Qt.CursorShape.PointingHandCursor)
    button.setAutoRaise(True)
    return button


class RichLabel(QLabel):
    """A word-wrapped QLabel whose size questions cost one document layout, not eight.

    QLabel lays its document out twice on every `heightForWidth` call (at the asked
    width, then back), and its size hints try several more widths (0, ideal, unbounded).
    Layouts ask every card of the conversation whenever one of them grows, so without
    this each streamed update re-laid out all 200 messages. Here the height is cached
    per width until the text or look changes, and the hints come from that height.
    """

    HFW_CACHE_SIZE = 4

    def __init__(self, **properties):
        super().__init__(**properties)
        self._heights: dict[int, int] = {}

    def setText(self, text: str) -> None:
        """Replace the text and forget the cached heights."""
        self._heights.clear()
        super().setText(text)

    def heightForWidth(self, width: int) -> int:
        """QLabel's answer, computed once per width."""
        if width not in self._heights:
            if len(self._heights) >= self.HFW_CACHE_SIZE:
                self._heights.clear()
            self._heights[width] = super().heightForWidth(width)
        return self._heights[width]

    def sizeHint(self) -> QSize:
        """Its height at its current width; a one-line guess before its first layout."""
        if self.testAttribute(Qt.WidgetAttribute.WA_Resized):
            return QSize(self.width(), self.heightForWidth(self.width()))
        return QSize(HINT_WIDTH, self.fontMetrics().height())

    def minimumSizeHint(self) -> QSize:
        """No minimum: the layout gives the label its height for its width."""
        return QSize(0, 0)

    def changeEvent(self, event: QEvent) -> None:
        """Font, style or margins may have changed: forget the cached heights."""
        self._heights.clear()
        super().changeEvent(event)


def hint_at_own_width(widget: QWidget) -> QSize:
    """A size hint for a height-for-width widget: its height at the width it will get.

    That is its width once laid out, before that the width inside its parent's layout
    margins. QWidget's default hint asks the layout for its preferred width (for a card:
    the width of its buttons; for text: 1 px) and lays the whole text out at that width.
    """
    width = widget.width()
    if not widget.testAttribute(Qt.WidgetAttribute.WA_Resized):
        parent = widget.parentWidget()
        layout = parent.layout() if parent is not None else None
        width = layout.contentsRect().width() if layout is not None else 0
    width = width if width > 0 else HINT_WIDTH
    return QSize(width, widget.heightForWidth(width))


class MarkdownView(QWidget):
    """Markdown shown as a column of RichLabels, one per `segments` piece of the text.

    A streaming answer changes only its last piece, so each update re-renders a page
    or so of text however long the answer has grown. (Text selection stays within one
    piece.)
    """

    link_activated = Signal(str)

    def __init__(self, name: str):
        super().__init__(objectName=name)
        self.setAttribute(Qt.WidgetAttribute.WA_StyledBackground)  # let stylesheets draw borders
        self._layout = QVBoxLayout(self)
        self._layout.setContentsMargins(0, 0, 0, 0)
        self._layout.setSpacing(0)
        self._labels: list[RichLabel] = []
        self._shown: list[tuple[Segment, bool] | None] = []  # what each label renders, in which theme

    def set_markdown(self, text: str, dark: bool) -> None:
        """Show `text`, re-rendering only the pieces that changed."""
        pieces = segments(text) if text.strip() else []
        for index, piece in enumerate(pieces):
            if index == len(self._labels):
                self._labels.append(self._new_label())
                self._shown.append(None)
            if self._shown[index] != (piece, dark):
                self._labels[index].setText(render_markdown(piece.source, dark, piece.first_code_index))
                self._shown[index] = (piece, dark)
        for label in self._labels[len(pieces):]:
            label.deleteLater()
        del self._labels[len(pieces):], self._shown[len(pieces):]

    def sizeHint(self) -> QSize:
        """Its height at the width it has: see `hint_at_own_width`."""
        return hint_at_own_width(self)

    def html(self) -> str:
        """The rendered HTML of all pieces."""
        return "".join(label.text() for label in self._labels)

    def _new_label(self) -> RichLabel:
        """A selectable, word-wrapped rich-text label for one piece."""
        label = RichLabel(wordWrap=True, textFormat=Qt.TextFormat.RichText)
        label.setTextInteractionFlags(Qt.TextInteractionFlag.TextBrowserInteraction)
        label.setOpenExternalLinks(False)
        label.setMinimumWidth(1)  # long words and lines wrap or clip; they never widen the view
        label.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        label.linkActivated.connect(self.link_activated)
        self._layout.addWidget(label)
        return label


class MessageWidget(QFrame):
    """A card showing one message, with Copy, Edit (user) and Regenerate (last answer)."""

    edit_submitted = Signal(int, str)  # position of the edited message, its new text
    regenerate_requested = Signal()
    continue_requested = Signal()
    version_requested = Signal(int, int)  # position of the message, version to show (from 0)

    def __init__(self, message: dict, dark: bool = False, parent: QWidget | None = None):
        super().__init__(parent)
        self.position: int = message.get("position", -1)
        self.role: str = message.get("role", "assistant")
        self.model: str | None = message.get("model")
        self.state: str = COMPLETE
        self.metrics: dict | None = None
        self._dark = dark
        self._content = ""
        self._answer = ""
        self._reasoning: str | None = None
        self._reasoning_complete = True
        self._pulse = 0
        self._pulse_timer = QTimer(self, interval=PULSE_MS, timeout=self._advance_pulse)
        self.setProperty("role", self.role)
        self.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Maximum)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(16, 10, 16, 8)
        layout.setSpacing(6)
        layout.addLayout(self._build_header())
        layout.addWidget(self._build_reasoning())
        layout.addWidget(self.reasoning_body)
        self.body = MarkdownView("MessageBody")
        self.body.link_activated.connect(lambda href: self.open_link(href, self._answer))
        layout.addWidget(self.body)
        self.editor_panel: QWidget | None = None  # built on first Edit: most messages never are
        self.note = QLabel(objectName="MessageNote", wordWrap=True, visible=False)
        self.note.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        layout.addWidget(self.note)
        layout.addLayout(self._build_footer())
        self.set_content(message.get("content", ""))
        self.set_metrics(message.get("metrics"))
        self.set_state(message.get("state") or COMPLETE)
        self.set_versions(message.get("active", 0), message.get("versions", 1))

    def resizeEvent(self, event: QResizeEvent) -> None:
        """At a new width the text wraps anew: ask the layout for the height that now needs."""
        super().resizeEvent(event)
        if event.oldSize().width() != event.size().width():
            self.updateGeometry()

    def sizeHint(self) -> QSize:
        """Its height at the width it has: see `hint_at_own_width`."""
        return hint_at_own_width(self)

    # -- building ------------------------------------------------------------------

    def _build_header(self) -> QHBoxLayout:
        """Role label, model name and the streaming indicator."""
        row = QHBoxLayout()
        row.setSpacing(8)
        self.role_label = QLabel("You" if self.role == "user" else self.role.capitalize(), objectName="MessageRole")
        self.model_label = QLabel(self.model or "", objectName="MessageModel")
        self.model_label.setVisible(bool(self.model and self.role == "assistant"))
        self.status_label = QLabel(objectName="MessageStatus", visible=False)
        for label in (self.model_label, self.status_label):
            label.setFont(_small_font(label))
        row.addWidget(self.role_label)
        row.addWidget(self.model_label)
        row.addWidget(self.status_label)
        row.addStretch(1)
        return row

    def _build_reasoning(self) -> QToolButton:
        """The Reasoning toggle and its (hidden) body."""
        self.reasoning_toggle = QToolButton(objectName="ReasoningToggle", checkable=True, visible=False)
        self.reasoning_toggle.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        self.reasoning_toggle.setArrowType(Qt.ArrowType.RightArrow)
        self.reasoning_toggle.setCursor(Qt.CursorShape.PointingHandCursor)
        self.reasoning_toggle.toggled.connect(self._on_reasoning_toggled)
        self.reasoning_body = MarkdownView("ReasoningBody")
        self.reasoning_body.link_activated.connect(lambda href: self.open_link(href, self._reasoning or ""))
        self.reasoning_body.layout().setContentsMargins(12, 0, 0, 6)
        self.reasoning_body.setVisible(False)
        return self.reasoning_toggle

    def _build_editor(self) -> None:
        """The inline editor of a user message, under the body: text box, Cancel, Save & re-run."""
        self.editor_panel = QWidget()
        column = QVBoxLayout(self.editor_panel)
        column.setContentsMargins(0, 0, 0, 0)
        self.editor = QPlainTextEdit(objectName="MessageEditor")
        self.editor.setMinimumHeight(80)
        self.editor.setMaximumHeight(260)
        self.cancel_button = QPushButton("Cancel", clicked=self.cancel_edit)
        self.save_button = QPushButton("Save && re-run", clicked=self.submit_edit, default=True)
        for keys, slot in (("Ctrl+Return", self.submit_edit), ("Escape", self.cancel_edit)):
            shortcut = QShortcut(QKeySequence(keys), self.editor, context=Qt.ShortcutContext.WidgetShortcut)
            shortcut.activated.connect(slot)
        buttons = QHBoxLayout()
        buttons.addStretch(1)
        buttons.addWidget(self.cancel_button)
        buttons.addWidget(self.save_button)
        column.addWidget(self.editor)
        column.addLayout(buttons)
        self.layout().insertWidget(self.layout().indexOf(self.body) + 1, self.editor_panel)

    def _build_footer(self) -> QHBoxLayout:
        """The metrics line and the action buttons."""
        row = QHBoxLayout()
        row.setSpacing(2)
        self.details_label = QLabel(objectName="MessageDetails", visible=False)
        self.details_label.setFont(_small_font(self.details_label))
        self.copy_button = _action_button("Copy", "Copy this message")
        self.copy_button.clicked.connect(self.copy_to_clipboard)
        self.edit_button = _action_button("Edit", "Edit this message and answer it again (the earlier version is kept)")
        self.edit_button.clicked.connect(self.start_edit)
        self.edit_button.setVisible(self.role == "user")
        self.regenerate_button = _action_button("Regenerate", "Answer the last message again (the answer so far is kept)")
        self.regenerate_button.clicked.connect(self.regenerate_requested)
        self.regenerate_button.setVisible(False)
        self.continue_button = _action_button("Continue", "Go on writing this answer")
        self.continue_button.clicked.connect(self.continue_requested)
        self.continue_button.setVisible(False)
        self.previous_button = _action_button("‹", "The previous version of this message")
        self.previous_button.setAccessibleName("Previous version")
        self.previous_button.clicked.connect(lambda: self.version_requested.emit(self.position, self.active - 1))
        self.version_label = QLabel(objectName="VersionLabel")
        self.next_button = _action_button("›", "The next version of this message")
        self.next_button.setAccessibleName("Next version")
        self.next_button.clicked.connect(lambda: self.version_requested.emit(self.position, self.active + 1))
        row.addWidget(self.previous_button)
        row.addWidget(self.version_label)
        row.addWidget(self.next_button)
        row.addWidget(self.details_label)
        row.addStretch(1)
        for button in (self.copy_button, self.edit_button, self.continue_button, self.regenerate_button):
            button.setFont(_small_font(button))
            row.addWidget(button)
        return row

    # -- content -------------------------------------------------------------------

    def content(self) -> str:
        """The raw text of the message, as stored."""
        return self._content

    def set_content(self, text: str) -> None:
        """Show `text`: split off an assistant's reasoning, render the rest as markdown."""
        self._content = text
        if self.role == "assistant":
            self._reasoning, self._answer, self._reasoning_complete = split_reasoning(text)
        else:
            self._reasoning, self._answer, self._reasoning_complete = None, text, True
        self.body.set_markdown(self._answer, self._dark)
        self.copy_button.setVisible(bool(self._answer.strip()))
        self._refresh_reasoning()

    def set_dark(self, dark: bool) -> None:
        """Re-render with the dark (or light) code colours."""
        if dark != self._dark:
            self._dark = dark
            self.set_content(self._content)

    def _refresh_reasoning(self) -> None:
        """Update the reasoning toggle's label; re-render the body only if it is open."""
        has_reasoning = self._reasoning is not None
        self.reasoning_toggle.setVisible(has_reasoning)
        thinking = not self._reasoning_complete and self.state == STREAMING
        self.reasoning_toggle.setText("Thinking…" if thinking else "Reasoning")
        if has_reasoning and self.reasoning_toggle.isChecked():
            self.reasoning_body.set_markdown(self._reasoning, self._dark)
        self.reasoning_body.setVisible(has_reasoning and self.reasoning_toggle.isChecked())

    def _on_reasoning_toggled(self, expanded: bool) -> None:
        """Open or close the reasoning section."""
        self.reasoning_toggle.setArrowType(Qt.ArrowType.DownArrow if expanded else Qt.ArrowType.RightArrow)
        self._refresh_reasoning()

    # -- state and metrics -----------------------------------------------------------

    def set_state(self, state: str) -> None:
        """Show the message's state: streaming indicator, Stopped/Interrupted note, or error.

        An error's text is `metrics["error"]` (the controller puts it there); the message
        text stays as it was.
        """
        self.state = state
        streaming = state == STREAMING
        self.status_label.setVisible(streaming)
        if streaming:
            self._pulse_timer.start()
            self._advance_pulse()
        else:
            self._pulse_timer.stop()
        error = (self.metrics or {}).get("error") or "Something went wrong while answering."
        cut = (self.metrics or {}).get("finish_reason") == CUT_AT_LIMIT and state == COMPLETE
        note = error if state == ERROR else CUT_NOTE if cut else NOTES.get(state, "")
        self.note.setText(note)
        kind = "error" if state == ERROR else "info"
        if self.note.property("kind") != kind:
            self.note.setProperty("kind", kind)
            self.note.style().unpolish(self.note)  # restyle for the new property
            self.note.style().polish(self.note)
        self.note.setVisible(bool(note))
        self._refresh_reasoning()

    def set_metrics(self, metrics: dict | None) -> None:
        """Show an answer's final figures under it, all of them in the tooltip."""
        self.metrics = metrics
        summary = metrics_summary(metrics, self.model) if metrics and self.role == "assistant" else ""
        self.details_label.setText(summary)
        self.details_label.setToolTip(metrics_tooltip(metrics))
        self.details_label.setVisible(bool(summary))

    def _advance_pulse(self) -> None:
        """Animate the streaming indicator's dots."""
        self._pulse = (self._pulse + 1) % 4
        self.status_label.setText("writing" + "." * self._pulse)

    # -- actions ---------------------------------------------------------------------

    def set_versions(self, active: int, count: int) -> None:
        """Show "active + 1 / count" with arrows to the others, when there is more than one."""
        self.active, self._version_count = active, count
        for widget in (self.previous_button, self.version_label, self.next_button):
            widget.setVisible(count > 1)
        self.version_label.setText(f"{active + 1}/{count}")
        self.version_label.setAccessibleName(f"Version {active + 1} of {count}")
        self.previous_button.setEnabled(active > 0)
        self.next_button.setEnabled(active < count - 1)

    def set_regenerate_visible(self, visible: bool) -> None:
        """Offer Regenerate, and Continue where the answer ended early (on the last answer only)."""
        self.regenerate_button.setVisible(visible and self.role == "assistant")
        early = ended_early(self.state, self.metrics) and bool(self._content)
        self.continue_button.setVisible(visible and self.role == "assistant" and early)

    def set_actions_enabled(self, enabled: bool) -> None:
        """Allow or block Edit and Regenerate (blocked while an answer streams)."""
        for button in (self.edit_button, self.regenerate_button, self.continue_button,
                       self.previous_button, self.next_button):
            button.setEnabled(enabled)
        if enabled:
            self.set_versions(self.active, self._version_count)

    def copy_to_clipboard(self) -> None:
        """Copy the message's raw markdown (an answer without its reasoning)."""
        QApplication.clipboard().setText(self._answer)
        self.copy_button.setText("Copied")
        QTimer.singleShot(COPIED_FEEDBACK_MS, self, lambda: self.copy_button.setText("Copy"))

    def open_link(self, href: str, source: str) -> None:
        """Act on a clicked link: copy a code block of `source`, or open a web page."""
        url = QUrl(href)
        if url.scheme() == COPY_CODE_SCHEME:
            blocks = code_blocks(source)
            index = int(url.path()) if url.path().isdigit() else len(blocks)
            if index < len(blocks):
                QApplication.clipboard().setText(blocks[index])
                QToolTip.showText(QCursor.pos(), "Copied", self, QRect(), COPIED_FEEDBACK_MS)
        elif url.scheme() in WEB_SCHEMES:
            QDesktopServices.openUrl(url)

    def start_edit(self) -> None:
        """Swap the body for an editor holding the raw text."""
        if self.editor_panel is None:
            self._build_editor()
        self.editor.setPlainText(self._content)
        self.body.hide()
        self.editor_panel.show()
        self.edit_button.setVisible(False)
        self.editor.setFocus()

    def cancel_edit(self) -> None:
        """Leave the editor; the message is unchanged."""
        self.editor_panel.setVisible(False)
        self.edit_button.setVisible(self.role == "user")
        self.body.show()

    def submit_edit(self) -> None:
        """Emit the edited text with this message's position (ignored if empty)."""
        text = self.editor.toPlainText().strip()
        if not text:
            return
        self.cancel_edit()
        self.edit_submitted.emit(self.position, text)
