"""The completion view: where a base model goes on with the user's text, in place.

A base model was trained to continue text, not to chat, so it gets a plain editor: the
user writes a beginning, presses Continue (Ctrl+Enter), and the model's words stream in
at the end of the text, which stays editable between runs. One line says what base models
are for and how to get one that chats (the Get models view); "Chat anyway" opens the chat.
"""

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QKeySequence, QShortcut, QTextCursor
from PySide6.QtWidgets import QHBoxLayout, QLabel, QPlainTextEdit, QPushButton, QVBoxLayout, QWidget

GET_MODELS_LINK = "get-models"


class CompletionView(QWidget):
    """The editor, its one line of explanation, and Continue/Stop."""

    continue_requested = Signal(str)  # the whole text, to go on with
    stop_requested = Signal()
    chat_requested = Signal()  # "Chat anyway"
    get_models_requested = Signal()

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.explanation = QLabel(objectName="CompletionExplanation", wordWrap=True)
        self.explanation.setTextFormat(Qt.TextFormat.RichText)
        self.explanation.linkActivated.connect(lambda _link: self.get_models_requested.emit())
        self.chat_button = QPushButton("Chat anyway", autoDefault=False)
        self.chat_button.setToolTip("Chat with this model all the same; its answers may wander")
        self.chat_button.clicked.connect(self.chat_requested)
        self.editor = QPlainTextEdit(objectName="CompletionEditor")
        self.editor.setAccessibleName("Text for the model to continue")
        self.editor.setPlaceholderText("Write the beginning of a text (a story, a list, a letter); the model goes on.")
        self.run_button = QPushButton("Continue", objectName="SendButton")
        self.run_button.setToolTip("Let the model continue the text (Ctrl+Enter)")
        self.run_button.clicked.connect(self._run_or_stop)
        QShortcut(QKeySequence("Ctrl+Return"), self.editor, self._run_or_stop)
        self._running = False
        top = QHBoxLayout()
        top.addWidget(self.explanation, 1)
        top.addWidget(self.chat_button, 0, Qt.AlignmentFlag.AlignTop)
        bottom = QHBoxLayout()
        bottom.addStretch(1)
        bottom.addWidget(self.run_button)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(16, 12, 16, 16)
        layout.addLayout(top)
        layout.addWidget(self.editor, 1)
        layout.addLayout(bottom)
        self.set_model_name("This model")

    def set_model_name(self, name: str) -> None:
        """Say which model the view is for."""
        self.explanation.setText(
            f"<b>{name}</b> is a base model: it continues your text (drafts, autocompletion) rather than chat. "
            f'For chat, get an instruction-tuned model in <a href="{GET_MODELS_LINK}">Get models</a>.'
        )

    def set_running(self, running: bool) -> None:
        """While the model writes, the text is read-only and Continue becomes Stop."""
        self._running = running
        self.editor.setReadOnly(running)
        self.run_button.setText("Stop" if running else "Continue")
        self.run_button.setProperty("stop", running)
        self.run_button.style().unpolish(self.run_button)
        self.run_button.style().polish(self.run_button)

    def add_text(self, text: str) -> None:
        """Write the model's next words at the end of the text."""
        cursor = self.editor.textCursor()
        cursor.movePosition(QTextCursor.MoveOperation.End)
        cursor.insertText(text)
        self.editor.setTextCursor(cursor)
        self.editor.ensureCursorVisible()

    def _run_or_stop(self) -> None:
        if self._running:
            self.stop_requested.emit()
        elif self.editor.toPlainText().strip():
            self.continue_requested.emit(self.editor.toPlainText())
