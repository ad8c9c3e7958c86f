"""A one-line label and a button that shorten their text with "…" to the room they are given."""

from PySide6.QtCore import QSize, Qt
from PySide6.QtGui import QPainter, QPaintEvent, QResizeEvent
from PySide6.QtWidgets import QLabel, QPushButton, QSizePolicy, QWidget

MIN_WIDTH = 40  # the least room the label asks for, however long its text
MIN_BUTTON_WIDTH = 110  # the least room an ElidedButton takes


class ElidedLabel(QLabel):
    """A QLabel that never asks for the width of its whole text.

    It asks for its text's width but makes do with MIN_WIDTH; where it gets less than the
    text needs, it paints the text cut short with "…", and the tooltip shows all of it
    (unless a tooltip was set on purpose).
    """

    def __init__(self, text: str = "", parent: QWidget | None = None):
        super().__init__(parent)
        self.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Preferred)
        self._auto_tip = True
        self.setText(text)

    def setText(self, text: str) -> None:
        """Set the full text; the tooltip follows it unless one was set with `setToolTip`."""
        super().setText(text)
        if self._auto_tip:
            super().setToolTip(text)

    def setToolTip(self, tip: str) -> None:
        """A tooltip of its own, shown instead of the full text."""
        self._auto_tip = False
        super().setToolTip(tip)

    def minimumSizeHint(self) -> QSize:
        """Room for a few characters, not the whole text."""
        hint = super().minimumSizeHint()
        return QSize(min(hint.width(), MIN_WIDTH), hint.height())

    def is_elided(self) -> bool:
        """Whether the text is cut short at the label's present width."""
        return self.fontMetrics().horizontalAdvance(self.text()) > self.contentsRect().width()

    def paintEvent(self, event: QPaintEvent) -> None:
        """Paint the text, elided at the right to the width there is."""
        painter = QPainter(self)
        rect = self.contentsRect()
        shown = self.fontMetrics().elidedText(self.text(), Qt.TextElideMode.ElideRight, rect.width())
        painter.setPen(self.palette().color(self.foregroundRole()))
        painter.drawText(rect, int(self.alignment() | Qt.AlignmentFlag.AlignVCenter), shown)


class ElidedButton(QPushButton):
    """A push button whose text is cut short with "…" to the button's width.

    `suffix` (say, an arrow) always shows after the shortened text. The button asks for
    MIN_BUTTON_WIDTH at least and, as a label would, the width of its whole text at most.
    """

    def __init__(self, suffix: str = "", parent: QWidget | None = None):
        super().__init__(parent)
        self._full = ""
        self._suffix = suffix
        self.setMinimumWidth(MIN_BUTTON_WIDTH)

    def full_text(self) -> str:
        """The text before shortening, without the suffix."""
        return self._full

    def set_full_text(self, text: str) -> None:
        """Show `text` (shortened where the button is too narrow)."""
        self._full = text
        self._elide()

    def sizeHint(self) -> QSize:
        """The size for the whole text and the suffix."""
        hint = super().sizeHint()
        whole = self.fontMetrics().horizontalAdvance(self._full + self._suffix)
        shown = self.fontMetrics().horizontalAdvance(self.text())
        return QSize(hint.width() + whole - shown, hint.height())

    def resizeEvent(self, event: QResizeEvent) -> None:
        """Shorten the text again for the new width."""
        super().resizeEvent(event)
        self._elide()

    def _elide(self) -> None:
        chrome = super().sizeHint().width() - self.fontMetrics().horizontalAdvance(self.text())
        room = max(self.width() - chrome, 0) if self.isVisible() else 10_000
        shown = self.fontMetrics().elidedText(
            self._full, Qt.TextElideMode.ElideRight, room - self.fontMetrics().horizontalAdvance(self._suffix)
        )
        self.setText(shown + self._suffix)
