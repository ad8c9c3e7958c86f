"""One message of the conversation: who wrote it, its rendered text, and what can be done with it.

The body is a `MarkdownView` (`app/widgets/markdown_view.py`). Links are handled here:
`copy-code:N` copies the N-th code block, http(s) links open in the browser, any other
scheme is ignored. An assistant message may start with a `<think>` block; it is shown in
a collapsible "Reasoning" section, collapsed by default and rendered only when opened.
The look comes from the app's stylesheet (`MessageWidget[role="user"]` …) and from
`ChatView`'s stylesheet for the parts named by objectName below.
"""

from PySide6.QtCore import QRect, QSize, Qt, QTimer, QUrl, Signal
from PySide6.QtGui import QCursor, QDesktopServices, QKeySequence, QResizeEvent, QShortcut, QTextCursor
from PySide6.QtWidgets import (
    QApplication,
    QFrame,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QPushButton,
    QSizePolicy,
    QToolButton,
    QToolTip,
    QVBoxLayout,
    QWidget,
)

from app.markdown_render import COPY_CODE_SCHEME, code_blocks, split_reasoning
from app.metrics_text import metrics_summary, metrics_tooltip
from app.storage import CUT_AT_LIMIT, CUT_BY_CONTEXT, MessageState, ended_early
from app.widgets.elided_label import ElidedLabel
from app.widgets.markdown_view import MarkdownView, hint_at_own_width

NOTES = {
    MessageState.CANCELLED: "Stopped",
    MessageState.INTERRUPTED: "Interrupted — the app closed while this answer was being written",
}
CUT_NOTE = "Cut off at the token limit (Max tokens in the settings). Continue writes the rest."
CONTEXT_FULL_NOTE = (
    "The context is full ({used} of {size} tokens), so the answer stopped here. Continue makes room by "
    "leaving out the oldest turns; a new chat with a summary starts afresh from a summary of this one."
)


def cut_note(metrics: dict) -> str:
    """The note under an answer the token limit or a full context cut short ("" for any other)."""
    reason = metrics.get("finish_reason")
    if reason == CUT_AT_LIMIT:
        return CUT_NOTE
    if reason == CUT_BY_CONTEXT:
        size = metrics.get("context_size") or 0
        used = metrics.get("context_used") or size
        return CONTEXT_FULL_NOTE.format(used=f"{used:,}", size=f"{size:,}")
    return ""


WEB_SCHEMES = ("http", "https")
COPIED_FEEDBACK_MS = 1200
PULSE_MS = 400


def _action_button(text: str, tooltip: str) -> QToolButton:
    """A small, flat button of the message's action row."""
    button = QToolButton()
    button.setObjectName("MessageAction")
    button.setText(text)
    button.setToolTip(tooltip)
    button.setCursor(Qt.CursorShape.PointingHandCursor)
    button.setAutoRaise(True)
    return button


class MessageWidget(QFrame):
    """A card showing one message, with Copy, Edit (user) and Regenerate (last answer)."""

    edit_submitted = Signal(int, str)  # position of the edited message, its new text
    regenerate_requested = Signal()
    continue_requested = Signal()
    summary_requested = Signal()  # a new chat from a summary of this one (offered when the context is full)
    editing_started = Signal()  # the inline editor opened: the view brings it into sight
    version_requested = Signal(int, int)  # position of the message, version to show (from 0)

    def __init__(self, message: dict, dark: bool = False, parent: QWidget | None = None):
        super().__init__(parent)
        self.position: int = message.get("position", -1)
        self.role: str = message.get("role", "assistant")
        self.model: str | None = message.get("model")
        self.state = MessageState.COMPLETE
        self.metrics: dict | None = None
        self._dark = dark
        self._content = ""
        self._answer = ""
        self._reasoning: str | None = None
        self._reasoning_complete = True
        self._pulse = 0
        self._pulse_timer = QTimer(self, interval=PULSE_MS)
        self._pulse_timer.timeout.connect(self._advance_pulse)
        self.setProperty("role", self.role)
        self.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Maximum)
        self._column = layout = QVBoxLayout(self)
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
        self.set_state(message.get("state") or MessageState.COMPLETE)
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
        row.addWidget(self.role_label)
        row.addWidget(self.model_label)
        row.addWidget(self.status_label)
        row.addStretch(1)
        return row

    def _build_reasoning(self) -> QToolButton:
        """The Reasoning toggle and its (hidden) body."""
        self.reasoning_toggle = QToolButton()
        self.reasoning_toggle.setObjectName("ReasoningToggle")
        self.reasoning_toggle.setCheckable(True)
        self.reasoning_toggle.setVisible(False)
        self.reasoning_toggle.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        self.reasoning_toggle.setArrowType(Qt.ArrowType.RightArrow)
        self.reasoning_toggle.setCursor(Qt.CursorShape.PointingHandCursor)
        self.reasoning_toggle.toggled.connect(self._on_reasoning_toggled)
        self.reasoning_body = MarkdownView("ReasoningBody")
        self.reasoning_body.link_activated.connect(lambda href: self.open_link(href, self._reasoning or ""))
        self.reasoning_body.column.setContentsMargins(12, 0, 0, 6)
        self.reasoning_body.setVisible(False)
        return self.reasoning_toggle

    def _build_editor(self) -> QWidget:
        """The inline editor of a user message, under the body: text box, Cancel, Save & re-run."""
        panel = QWidget()
        column = QVBoxLayout(panel)
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
        self._column.insertWidget(self._column.indexOf(self.body) + 1, panel)
        return panel

    def _build_footer(self) -> QHBoxLayout:
        """The metrics line and the action buttons."""
        row = QHBoxLayout()
        row.setSpacing(2)
        self.details_label = ElidedLabel()  # cut short with "…" in a narrow card: it never widens the transcript
        self.details_label.setObjectName("MessageDetails")
        self.details_label.setVisible(False)
        self.copy_button = _action_button("Copy", "Copy this message")
        self.copy_button.clicked.connect(self.copy_to_clipboard)
        self.edit_button = _action_button("Edit", "Edit this message and answer it again (the earlier version is kept)")
        self.edit_button.clicked.connect(self.start_edit)
        self.edit_button.setVisible(self.role == "user")
        self.regenerate_button = _action_button(
            "Regenerate", "Answer the last message again (the answer so far is kept)"
        )
        self.regenerate_button.clicked.connect(self.regenerate_requested)
        self.regenerate_button.setVisible(False)
        self.continue_button = _action_button("Continue", "Go on writing this answer")
        self.continue_button.clicked.connect(self.continue_requested)
        self.continue_button.setVisible(False)
        self.summary_button = _action_button(
            "New chat with a summary", "Start a new chat that begins from a summary of this one"
        )
        self.summary_button.clicked.connect(self.summary_requested)
        self.summary_button.setVisible(False)
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
        for button in (
            self.copy_button,
            self.edit_button,
            self.summary_button,
            self.continue_button,
            self.regenerate_button,
        ):
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
        thinking = not self._reasoning_complete and self.state == MessageState.STREAMING
        self.reasoning_toggle.setText("Thinking…" if thinking else "Reasoning")
        if self._reasoning is not None and self.reasoning_toggle.isChecked():
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
        self.state = state = MessageState(state)
        streaming = state == MessageState.STREAMING
        self.status_label.setVisible(streaming)
        if streaming:
            self._pulse_timer.start()
            self._advance_pulse()
        else:
            self._pulse_timer.stop()
        error = (self.metrics or {}).get("error") or "Something went wrong while answering."
        cut = cut_note(self.metrics or {}) if state == MessageState.COMPLETE else ""
        note = error if state == MessageState.ERROR else cut or NOTES.get(state, "")
        self.note.setText(note)
        kind = "error" if state == MessageState.ERROR else "info"
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
        """Offer Regenerate, Continue where the answer ended early, and a new chat with a summary where the
        context was full (on the last answer only)."""
        self.regenerate_button.setVisible(visible and self.role == "assistant")
        early = ended_early(self.state, self.metrics) and bool(self._content)
        self.continue_button.setVisible(visible and self.role == "assistant" and early)
        full = (self.metrics or {}).get("finish_reason") == CUT_BY_CONTEXT
        self.summary_button.setVisible(visible and self.role == "assistant" and full)

    def set_actions_enabled(self, enabled: bool) -> None:
        """Allow or block Edit and Regenerate (blocked while an answer streams)."""
        for button in (
            self.edit_button,
            self.regenerate_button,
            self.continue_button,
            self.summary_button,
            self.previous_button,
            self.next_button,
        ):
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
            self.editor_panel = self._build_editor()
        self.editor.setPlainText(self._content)
        self.editor.moveCursor(QTextCursor.MoveOperation.Start)  # the text from its first line
        self.body.hide()
        self.editor_panel.show()
        self.edit_button.setVisible(False)
        self.editor.setFocus()
        self.editing_started.emit()

    def cancel_edit(self) -> None:
        """Leave the editor; the message is unchanged."""
        if self.editor_panel is not None:
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
