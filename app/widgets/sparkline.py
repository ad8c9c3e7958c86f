"""A tiny line chart of recent values, painted with QPainter."""

from PySide6.QtCore import QPointF, QSize, Qt
from PySide6.QtGui import QColor, QLinearGradient, QPainter, QPainterPath, QPaintEvent, QPen
from PySide6.QtWidgets import QSizePolicy, QWidget


class Sparkline(QWidget):
    """An antialiased polyline of values, with the area under it filled.

    The y axis runs from 0 to a little above the largest value; the x axis stretches
    the points over the width. It keeps fewer than CAPACITY points: when full, each pair
    of neighbours is merged into their mean and later values are averaged in buckets
    twice as large, so a long run still fits with even spacing and bounded cost.
    """

    CAPACITY = 256  # even, so that merging pairs leaves no point over

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self._points: list[float] = []
        self._bucket: list[float] = []
        self._bucket_size = 1
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)

    def sizeHint(self) -> QSize:
        """A short strip."""
        return QSize(160, 44)

    def points(self) -> list[float]:
        """The plotted values, oldest first."""
        return list(self._points)

    def append(self, value: float) -> None:
        """Add a value and repaint."""
        self._bucket.append(value)
        if len(self._bucket) < self._bucket_size:
            return
        self._points.append(sum(self._bucket) / len(self._bucket))
        self._bucket.clear()
        if len(self._points) == self.CAPACITY:
            pairs = zip(self._points[0::2], self._points[1::2], strict=True)  # CAPACITY is even
            self._points = [(a + b) / 2 for a, b in pairs]
            self._bucket_size *= 2
        self.update()

    def clear(self) -> None:
        """Forget every value."""
        self._points.clear()
        self._bucket.clear()
        self._bucket_size = 1
        self.update()

    def paintEvent(self, event: QPaintEvent) -> None:
        """Draw the filled area and the line in the palette's highlight colour."""
        if len(self._points) < 2:
            return
        rect = self.rect().adjusted(1, 2, -1, -1)
        top = max(self._points) * 1.15 or 1.0
        step = rect.width() / (len(self._points) - 1)
        line = QPainterPath(QPointF(rect.left(), rect.bottom() - self._points[0] / top * rect.height()))
        for i, value in enumerate(self._points[1:], start=1):
            line.lineTo(rect.left() + i * step, rect.bottom() - value / top * rect.height())

        area = QPainterPath(line)
        area.lineTo(rect.right(), rect.bottom())
        area.lineTo(rect.left(), rect.bottom())
        area.closeSubpath()

        colour = self.palette().highlight().color()
        fade = QLinearGradient(0, rect.top(), 0, rect.bottom())
        fade.setColorAt(0.0, QColor(colour.red(), colour.green(), colour.blue(), 90))
        fade.setColorAt(1.0, QColor(colour.red(), colour.green(), colour.blue(), 10))

        painter = QPainter(self)
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        painter.fillPath(area, fade)
        painter.setPen(QPen(colour, 1.6, Qt.PenStyle.SolidLine, Qt.PenCapStyle.RoundCap, Qt.PenJoinStyle.RoundJoin))
        painter.drawPath(line)
        painter.end()
