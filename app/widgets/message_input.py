"""The message box: Enter sends, Shift+Enter starts a new line."""

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QKeyEvent
from PySide6.QtWidgets import QPlainTextEdit, QWidget


class MessageInput(QPlainTextEdit):
    """A plain-text box that grows with its text up to a few lines and emits `submitted`."""

    submitted = Signal(str)

    MAX_LINES = 8

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("MessageInput")
        self.setPlaceholderText("Message Sprig…  (Enter sends, Shift+Enter for a new line)")
        self.setTabChangesFocus(True)
        self.document().contentsChanged.connect(self._fit_height)
        self._fit_height()

    def keyPressEvent(self, event: QKeyEvent) -> None:
        """Enter (without Shift) submits the text; everything else edits as usual."""
        if event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter) and not (
            event.modifiers() & Qt.KeyboardModifier.ShiftModifier
        ):
            text = self.toPlainText()
            if text.strip():
                self.submitted.emit(text)
            return
        super().keyPressEvent(event)

    def _fit_height(self) -> None:
        lines = min(max(self.document().blockCount(), 2), self.MAX_LINES)
        line_height = self.fontMetrics().lineSpacing()
        margins = self.contentsMargins().top() + self.contentsMargins().bottom()
        self.setFixedHeight(int(lines * line_height + 2 * self.document().documentMargin() + margins + 4))
