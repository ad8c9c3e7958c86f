"""A dismissable one-line message above the chat."""

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QToolButton, QWidget


class Banner(QFrame):
    """A dismissable one-line message above the chat (errors in red, notices in blue)."""

    def __init__(self, object_name: str, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName(object_name)
        self.label = QLabel()
        self.label.setWordWrap(True)
        self.label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        close = QToolButton()
        close.setText("✕")
        close.setAccessibleName("Dismiss")
        close.setToolTip("Dismiss")
        close.setAutoRaise(True)
        close.clicked.connect(self.hide)
        layout = QHBoxLayout(self)
        layout.setContentsMargins(12, 8, 8, 8)
        layout.addWidget(self.label, 1)
        layout.addWidget(close, 0, Qt.AlignmentFlag.AlignTop)
        self.hide()

    def show_text(self, text: str) -> None:
        """Show `text`, replacing what was there."""
        self.label.setText(text)
        self.show()

    def add_text(self, text: str) -> None:
        """Show `text` below what the banner shows already, or alone when it is hidden."""
        self.show_text(f"{self.label.text()}\n{text}" if self.isVisible() else text)
