"""A dismissable message above the chat: one line, and a Details disclosure for the rest."""

from PySide6.QtCore import Qt
from PySide6.QtGui import QResizeEvent
from PySide6.QtWidgets import QFrame, QGridLayout, QPlainTextEdit, QToolButton, QWidget

from app.widgets.elided_label import ElidedLabel

DETAILS_LINES = 8  # the details box's height in lines; longer details scroll


class Banner(QFrame):
    """A dismissable message above the chat (errors in red, notices in blue).

    However long the message, the banner shows one line: the first line of the first
    message, cut short with "…" if need be, and how many more lines there are. The rest
    is behind "Details", in a box that scrolls after DETAILS_LINES lines.
    """

    def __init__(self, object_name: str, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName(object_name)
        self._lines: list[str] = []
        self.label = ElidedLabel()
        self.details_button = QToolButton()
        self.details_button.setCheckable(True)
        self.details_button.setAutoRaise(True)
        self.details_button.setText("Details")
        self.details_button.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        self.details_button.setArrowType(Qt.ArrowType.RightArrow)
        self.details_button.toggled.connect(self._show_details)
        self.details = QPlainTextEdit(readOnly=True, visible=False)
        self.details.setObjectName("BannerDetails")
        self.details.setAccessibleName("Details")
        self.details.setLineWrapMode(QPlainTextEdit.LineWrapMode.WidgetWidth)
        close = QToolButton()
        close.setText("✕")
        close.setAccessibleName("Dismiss")
        close.setToolTip("Dismiss")
        close.setAutoRaise(True)
        close.clicked.connect(self.hide)
        layout = QGridLayout(self)
        layout.setContentsMargins(12, 4, 8, 4)
        layout.addWidget(self.label, 0, 0)
        layout.addWidget(self.details_button, 0, 1)
        layout.addWidget(close, 0, 2)
        layout.addWidget(self.details, 1, 0, 1, 3)
        layout.setColumnStretch(0, 1)
        self.hide()

    def text(self) -> str:
        """The whole message, every line of it."""
        return "\n".join(self._lines)

    def show_text(self, text: str) -> None:
        """Show `text`, replacing what was there; its first line is the headline."""
        self._lines = text.splitlines() or [""]
        self.details_button.setChecked(False)
        self._refresh()
        self.show()

    def add_text(self, text: str) -> None:
        """Add `text` below what the banner shows already, or show it alone when hidden."""
        if not self.isVisible():
            self.show_text(text)
            return
        self._lines += text.splitlines()
        self._refresh()

    def _refresh(self) -> None:
        """Headline, Details button and details box for the current lines."""
        more = len(self._lines) - 1
        headline = self._lines[0] + (f"  (+{more} more line{'s' * (more != 1)})" if more else "")
        self.label.setText(headline)
        self.label.setToolTip(self._lines[0])
        self.details.setPlainText(self.text())
        line = self.details.fontMetrics().lineSpacing()
        self.details.setFixedHeight(line * min(len(self._lines), DETAILS_LINES) + 12)
        self.details_button.setVisible(bool(more) or self.label.is_elided())
        if not self.details_button.isVisible():
            self.details_button.setChecked(False)

    def _show_details(self, shown: bool) -> None:
        """Open or close the details box."""
        self.details_button.setArrowType(Qt.ArrowType.DownArrow if shown else Qt.ArrowType.RightArrow)
        self.details.setVisible(shown)

    def resizeEvent(self, event: QResizeEvent) -> None:
        """A narrower banner may cut the headline: offer Details for it."""
        super().resizeEvent(event)
        if self._lines:
            self.details_button.setVisible(len(self._lines) > 1 or self.label.is_elided())
