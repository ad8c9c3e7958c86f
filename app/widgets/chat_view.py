"""The conversation: a scrolling column of message cards, centred at a readable width.

The controller drives it: `set_messages` when a conversation opens, `append_message`
for each new message, `update_streaming` with the whole answer so far (about 30 times a
second; only the last card re-renders), `finish_streaming` when the answer ends. While
an answer streams the view follows it down, unless the user has scrolled up to read.
"""

from PySide6.QtCore import QPoint, QRect, QSize, Qt, QTimer, Signal
from PySide6.QtWidgets import QFrame, QLabel, QScrollArea, QSizePolicy, QVBoxLayout, QWidget

from app.storage import MessageState
from app.widgets.message_widget import MessageWidget

COLUMN_WIDTH = 860  # px, cards and margins; longer lines are hard to read
MARGIN = 16  # px around the column
FOLLOW_MARGIN = 24  # px from the bottom that still counts as "at the bottom"
ERROR_COLOURS = {False: ("#8f1d1d", "#fdecec"), True: ("#f4b4b4", "#3a1f22")}  # text, background

STYLESHEET = """
#ChatCanvas {{ background: transparent; }}
#MessageRole {{ font-weight: bold; }}
#MessageModel, #MessageStatus, #MessageDetails, #ChatPlaceholder {{ color: palette(placeholder-text); }}
QToolButton#MessageAction {{
    background: transparent; border: none; border-radius: 6px; padding: 2px 8px;
    color: palette(placeholder-text);
}}
QToolButton#MessageAction:hover {{ background: palette(midlight); color: palette(text); }}
QToolButton#MessageAction:disabled {{ color: palette(mid); }}
QToolButton#ReasoningToggle {{
    background: transparent; border: none; padding: 2px 0; color: palette(placeholder-text);
}}
QToolButton#ReasoningToggle:hover {{ color: palette(text); }}
#ReasoningBody {{ border: none; border-left: 2px solid palette(mid); }}
#ReasoningBody QLabel {{ color: palette(placeholder-text); }}
QLabel#MessageNote[kind="info"] {{ color: palette(placeholder-text); font-style: italic; }}
QLabel#MessageNote[kind="error"] {{
    color: {error_text}; background: {error_background}; border-radius: 6px; padding: 6px 8px;
}}
"""


class _CentredLayout(QVBoxLayout):
    """A vertical layout whose side margins keep its content at most COLUMN_WIDTH wide, centred.

    Margins rather than stretches either side: a stretch takes its share of any width
    the layout is asked about, so the cards would be measured at widths they never get.
    The margins are set as the layout receives its geometry, before it places anything.
    """

    def setGeometry(self, rect: QRect) -> None:
        """Centre the column in `rect`, then lay it out."""
        side = self.side_margin(rect.width())
        if self.contentsMargins().left() != side:
            self.setContentsMargins(side, MARGIN, side, MARGIN)
        super().setGeometry(rect)

    def minimumSize(self) -> QSize:
        """The minimum with sides of MARGIN, not the centring margins of the current width.

        The centring margins grow with the width. Counted in the minimum, a canvas whose
        content was wider than the column would get a minimum wider than itself; the
        scroll area then widened it, which widened the margins and so the minimum, inside
        its own resize handler, until the stack overflowed (a crash seen in CI).
        """
        size = super().minimumSize()
        extra = 2 * (self.contentsMargins().left() - MARGIN)
        return QSize(max(0, size.width() - extra), size.height())

    @staticmethod
    def side_margin(width: int) -> int:
        """The side margin that centres the column in `width`."""
        return max(MARGIN, (width - COLUMN_WIDTH) // 2 + MARGIN)


class _Canvas(QWidget):
    """The scroll area's widget, holding the centred column."""

    def __init__(self):
        super().__init__(objectName="ChatCanvas")
        self.column = _CentredLayout(self)
        self.column.setSpacing(14)

    def heightForWidth(self, width: int) -> int:
        """The height at `width` with the margins that width would get.

        The scroll area asks about widths the canvas does not have yet (with and
        without the scroll bar); with the current margins the cards would be measured,
        and their text laid out, at widths they never get.
        """
        current = self.column.contentsMargins()
        return super().heightForWidth(self.card_width(width) + current.left() + current.right())

    def card_width(self, width: int | None = None) -> int:
        """The width of the cards when the canvas is `width` (default: its own) wide."""
        width = self.width() if width is None else width
        return width - 2 * _CentredLayout.side_margin(width)


class ChatView(QScrollArea):
    """The scrolling list of messages, with an empty-state hint and info notices."""

    edit_submitted = Signal(int, str)  # position of the edited user message, its new text
    regenerate_requested = Signal()
    continue_requested = Signal()
    summary_requested = Signal()
    version_requested = Signal(int, int)  # position of a message, version to show (from 0)

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("ChatView")
        self.setWidgetResizable(True)
        self.setFrameShape(QFrame.Shape.NoFrame)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self._dark = False
        self._messages: list[MessageWidget] = []
        self._follow = True
        self._canvas = self._build_canvas()
        self.setWidget(self._canvas)
        scrollbar = self.verticalScrollBar()
        scrollbar.valueChanged.connect(self._on_scrolled)
        scrollbar.rangeChanged.connect(self._on_range_changed)
        self._apply_stylesheet()

    def _build_canvas(self) -> _Canvas:
        """The centred column: placeholder, messages and notices, then a filler."""
        canvas = _Canvas()
        self._list = canvas.column
        self.placeholder = QLabel("Type a message to start", objectName="ChatPlaceholder", wordWrap=True)
        self.placeholder.setAlignment(Qt.AlignmentFlag.AlignCenter)  # larger text: app.theme.LARGE_TEXT
        self._filler = QWidget(visible=False)  # keeps the messages at the top
        self._filler.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Expanding)
        self._list.addWidget(self.placeholder, 1)
        self._list.addWidget(self._filler, 1)
        return canvas

    def _apply_stylesheet(self) -> None:
        """Style the cards' parts; colours come from the palette, errors from the theme."""
        text, background = ERROR_COLOURS[self._dark]
        self.setStyleSheet(STYLESHEET.format(error_text=text, error_background=background))

    # -- the controller's API --------------------------------------------------------

    def messages(self) -> list[MessageWidget]:
        """The message cards, top to bottom."""
        return list(self._messages)

    def has_messages(self) -> bool:
        """True if the view shows at least one message."""
        return bool(self._messages)

    def message_texts(self) -> list[str]:
        """The raw text of each message, top to bottom."""
        return [widget.content() for widget in self._messages]

    def clear(self) -> None:
        """Remove every message and notice; show the placeholder."""
        self._remove_from(1)
        self._messages.clear()
        self._show_placeholder_if_empty()

    def set_messages(self, messages: list[dict]) -> None:
        """Show a whole conversation (dicts: position, role, content, model, metrics, state)."""
        canvas = self._canvas
        canvas.setUpdatesEnabled(False)
        self.clear()
        for message in messages:
            self._add(message)
        self._after_change()
        self._follow = True
        canvas.setUpdatesEnabled(True)

    def append_message(self, message: dict) -> MessageWidget:
        """Add one message at the end and scroll to it."""
        widget = self._add(message)
        self._after_change()
        self._follow = True
        return widget

    def update_streaming(self, text: str) -> None:
        """Show the streaming answer's whole text so far in the last card."""
        if self._messages:
            self._messages[-1].set_content(text)

    def finish_streaming(self, metrics: dict | None, state: str) -> None:
        """End the streaming answer: its final figures and state (complete, cancelled, error…)."""
        if self._messages:
            last = self._messages[-1]
            last.set_metrics(metrics)
            last.set_state(state)
        self._after_change()

    def show_notice(self, text: str) -> None:
        """Add an information banner (e.g. old turns dropped from the context) at the end."""
        notice = QLabel(text, objectName="InfoBanner", wordWrap=True)
        notice.setMargin(8)
        notice.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self._list.insertWidget(self._list.count() - 1, notice)
        self._show_placeholder_if_empty()

    def truncate_from(self, position: int) -> None:
        """Remove the messages at and after `position`, and the notices among them."""
        first = next((w for w in self._messages if w.position >= position), None)
        if first is None:
            return
        self._remove_from(self._list.indexOf(first))
        self._messages = [w for w in self._messages if w.position < position]
        self._after_change()

    def set_dark(self, dark: bool) -> None:
        """Switch code colours and error styles to the dark (or light) theme."""
        self._dark = dark
        self._apply_stylesheet()
        for widget in self._messages:
            widget.set_dark(dark)

    def set_placeholder(self, text: str) -> None:
        """The hint shown while there are no messages, e.g. the model name and 'Type a message…'."""
        self.placeholder.setText(text)

    def is_following(self) -> bool:
        """True if the view keeps scrolling to the bottom as content grows."""
        return self._follow

    # -- internals --------------------------------------------------------------------

    def _add(self, message: dict) -> MessageWidget:
        """Create a card for `message` before the filler and wire its signals."""
        widget = MessageWidget(message, self._dark)
        widget.edit_submitted.connect(self.edit_submitted)
        widget.regenerate_requested.connect(self.regenerate_requested)
        widget.continue_requested.connect(self.continue_requested)
        widget.summary_requested.connect(self.summary_requested)
        widget.editing_started.connect(lambda: self._bring_editor_into_view(widget))
        widget.version_requested.connect(self.version_requested)
        self._list.insertWidget(self._list.count() - 1, widget)
        widget.resize(self._canvas.card_width(), widget.height())  # lay its text out once, at its width
        self._messages.append(widget)
        return widget

    def _bring_editor_into_view(self, widget: MessageWidget) -> None:
        """Stop following the bottom and scroll so the card's editor shows from its top, once laid out."""
        self._follow = False
        QTimer.singleShot(0, self, lambda: self._scroll_to_editor(widget))

    def _scroll_to_editor(self, widget: MessageWidget) -> None:
        panel = widget.editor_panel
        if panel is not None and panel.isVisible():
            top = panel.mapTo(self._canvas, QPoint(0, 0)).y()
            bar = self.verticalScrollBar()
            if not bar.value() <= top <= bar.value() + self.viewport().height() - panel.height():
                bar.setValue(max(0, top - MARGIN))

    def _remove_from(self, index: int) -> None:
        """Delete the layout's widgets from `index` up to (not including) the filler."""
        while self._list.count() - 1 > index:
            widget = self._list.takeAt(index).widget()
            widget.hide()
            widget.deleteLater()

    def _after_change(self) -> None:
        """Placeholder, and which card offers Regenerate and Edit, after the list changed."""
        streaming = bool(self._messages) and self._messages[-1].state == MessageState.STREAMING
        for widget in self._messages:
            widget.set_regenerate_visible(widget is self._messages[-1] and not streaming)
            widget.set_actions_enabled(not streaming)
        self._show_placeholder_if_empty()

    def _show_placeholder_if_empty(self) -> None:
        """The placeholder fills the column when there is nothing else; the filler otherwise."""
        empty = self._list.count() == 2
        self.placeholder.setVisible(empty)
        self._filler.setVisible(not empty)

    def _on_scrolled(self, value: int) -> None:
        """Follow new content only while the user is at the bottom."""
        self._follow = value >= self.verticalScrollBar().maximum() - FOLLOW_MARGIN

    def _on_range_changed(self, _minimum: int, maximum: int) -> None:
        """Content grew or shrank: stay at the bottom if we were following."""
        if self._follow:
            self.verticalScrollBar().setValue(maximum)
