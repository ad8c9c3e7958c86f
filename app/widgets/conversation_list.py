"""The sidebar: new chat, search, the list of conversations, import."""

import time

from PySide6.QtCore import QEvent, QObject, QPoint, Qt, QTimer, Signal
from PySide6.QtGui import QFocusEvent, QKeyEvent
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QMenu,
    QMessageBox,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from app.storage import Conversation

SEARCH_DELAY_MS = 200


def age_text(timestamp: float, now: float | None = None) -> str:
    """'just now', '5 min ago', '3 h ago', '2 days ago' for a list subtitle."""
    seconds = max(0.0, (now or time.time()) - timestamp)
    if seconds < 60:
        return "just now"
    if seconds < 3600:
        return f"{int(seconds // 60)} min ago"
    if seconds < 86400:
        return f"{int(seconds // 3600)} h ago"
    days = int(seconds // 86400)
    return f"{days} day{'s' if days > 1 else ''} ago"


class _RenameBox(QLineEdit):
    """The inline title editor: says `cancelled` on Escape or when it loses the focus."""

    cancelled = Signal()

    def keyPressEvent(self, event: QKeyEvent) -> None:
        """Escape cancels; other keys edit."""
        if event.key() == Qt.Key.Key_Escape:
            self.cancelled.emit()
            return
        super().keyPressEvent(event)

    def focusOutEvent(self, event: QFocusEvent) -> None:
        """Clicking elsewhere cancels, as in a file manager."""
        super().focusOutEvent(event)
        self.cancelled.emit()


class ConversationList(QFrame):
    """Lists conversations; asks the window to open, rename, delete, export or import them."""

    new_requested = Signal()
    opened = Signal(int)  # conversation id
    search_changed = Signal(str)
    rename_requested = Signal(int, str)
    delete_requested = Signal(int)
    export_requested = Signal(int, str)  # conversation id, "markdown" or "json"
    import_requested = Signal()

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("Sidebar")
        layout = QVBoxLayout(self)
        layout.setContentsMargins(10, 10, 10, 10)
        layout.setSpacing(8)

        title = QLabel("Sprig")
        title.setObjectName("AppTitle")
        self.new_button = QPushButton("+  New chat")
        self.new_button.setObjectName("NewChatButton")
        self.new_button.clicked.connect(self.new_requested)
        self.search = QLineEdit()
        self.search.setPlaceholderText("Search chats…")
        self.search.setClearButtonEnabled(True)
        self._search_timer = QTimer(self, singleShot=True, interval=SEARCH_DELAY_MS)
        self._search_timer.timeout.connect(lambda: self.search_changed.emit(self.search.text()))
        self.search.textChanged.connect(self._search_timer.start)

        self.list = QListWidget()
        self.list.setObjectName("ConversationList")
        self.list.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.list.setTextElideMode(Qt.TextElideMode.ElideRight)
        self.list.setWordWrap(False)
        self.list.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        self.list.customContextMenuRequested.connect(self._context_menu)
        self.list.itemClicked.connect(lambda item: self.opened.emit(item.data(Qt.ItemDataRole.UserRole)))
        self.list.itemDoubleClicked.connect(self.start_rename)
        self.list.setAccessibleName("Conversations")
        self.search.setAccessibleName("Search chats")
        self.list.installEventFilter(self)  # F2 renames the current chat
        self._editor: QLineEdit | None = None  # the inline rename box, while one is open
        self.empty_label = QLabel("No chats yet")
        self.empty_label.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.empty_label.setObjectName("MutedLabel")

        self.import_button = QPushButton("Import…")
        self.import_button.setToolTip("Import a conversation exported as JSON")
        self.import_button.clicked.connect(self.import_requested)
        footer = QHBoxLayout()
        footer.addWidget(self.import_button)
        footer.addStretch(1)

        layout.addWidget(title)
        layout.addWidget(self.new_button)
        layout.addWidget(self.search)
        layout.addWidget(self.empty_label)
        layout.addWidget(self.list, 1)
        layout.addLayout(footer)

    def set_conversations(
        self, conversations: list[Conversation], current: int | None, snippets: dict[int, str] | None = None
    ) -> None:
        """Show `conversations` (newest first) and highlight `current`.

        `snippets` (conversation id → text around a search match) replace the age line.
        """
        self.cancel_rename()
        self.list.clear()
        self.list.clearSelection()
        now = time.time()
        for conversation in conversations:
            second_line = (snippets or {}).get(conversation.id) or age_text(conversation.updated_at, now)
            item = QListWidgetItem(f"{conversation.title}\n{second_line}")
            item.setData(Qt.ItemDataRole.UserRole, conversation.id)
            item.setToolTip(conversation.title)
            self.list.addItem(item)
            if conversation.id == current:
                item.setSelected(True)
                self.list.setCurrentItem(item)
        searching = bool(self.search.text().strip())
        self.empty_label.setText("No chat matches" if searching else "No chats yet")
        self.empty_label.setVisible(not conversations)

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        """F2 on the list renames the current chat in place."""
        if (
            watched is self.list
            and isinstance(event, QKeyEvent)
            and event.type() == QEvent.Type.KeyPress
            and event.key() == Qt.Key.Key_F2
        ):
            self.start_rename(self.list.currentItem())
            return True
        return super().eventFilter(watched, event)

    def start_rename(self, item: QListWidgetItem | None) -> QLineEdit | None:
        """Edit the title of `item` in place: Enter renames, Escape or leaving the box cancels."""
        if item is None:
            return None
        self.cancel_rename()
        conversation_id, title = item.data(Qt.ItemDataRole.UserRole), item.toolTip()
        editor = _RenameBox(title, self.list.viewport())
        editor.setGeometry(self.list.visualItemRect(item))
        editor.returnPressed.connect(lambda: self._finish_rename(conversation_id, editor.text(), title))
        editor.cancelled.connect(self.cancel_rename)
        editor.show()
        editor.setFocus()
        editor.selectAll()
        self._editor = editor
        return editor

    def cancel_rename(self) -> None:
        """Close the inline rename box, if open, without renaming."""
        editor, self._editor = self._editor, None
        if editor is not None:
            editor.hide()
            editor.deleteLater()

    def _finish_rename(self, conversation_id: int, text: str, old_title: str) -> None:
        self.cancel_rename()
        if text.strip() and text.strip() != old_title:
            self.rename_requested.emit(conversation_id, text.strip())

    def ids(self) -> list[int]:
        """The listed conversation ids, top to bottom."""
        return [self.list.item(i).data(Qt.ItemDataRole.UserRole) for i in range(self.list.count())]

    def _context_menu(self, point: QPoint) -> None:
        item = self.list.itemAt(point)
        if item is None:
            return
        conversation_id = item.data(Qt.ItemDataRole.UserRole)
        title = item.toolTip()
        menu = QMenu(self)
        menu.addAction("Rename", lambda: self.start_rename(item))
        menu.addAction("Export as Markdown…", lambda: self.export_requested.emit(conversation_id, "markdown"))
        menu.addAction("Export as JSON…", lambda: self.export_requested.emit(conversation_id, "json"))
        menu.addSeparator()
        menu.addAction("Delete…", lambda: self._delete(conversation_id, title))
        menu.exec(self.list.mapToGlobal(point))

    def _delete(self, conversation_id: int, title: str) -> None:
        answer = QMessageBox.question(self, "Delete chat", f"Delete “{title}” and all its messages?")
        if answer == QMessageBox.StandardButton.Yes:
            self.delete_requested.emit(conversation_id)
