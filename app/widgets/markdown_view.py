"""Markdown shown as rich-text labels: the body of a message card, and its reasoning.

`MarkdownView` renders through `app.markdown_render`, one `RichLabel` per piece of a long
text (see `segments`), so that a streaming answer re-renders only its last piece.
"""

from PySide6.QtCore import QEvent, QSize, Qt, Signal
from PySide6.QtWidgets import QLabel, QSizePolicy, QVBoxLayout, QWidget

from app.markdown_render import Segment, render_markdown, segments

HINT_WIDTH = 600  # px, a rich label's width before it has been laid out


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
        super().__init__()
        self.setObjectName(name)
        self.setAttribute(Qt.WidgetAttribute.WA_StyledBackground)  # let stylesheets draw borders
        self.column = QVBoxLayout(self)
        self.column.setContentsMargins(0, 0, 0, 0)
        self.column.setSpacing(0)
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
        for label in self._labels[len(pieces) :]:
            label.deleteLater()
        del self._labels[len(pieces) :], self._shown[len(pieces) :]

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
        self.column.addWidget(label)
        return label
