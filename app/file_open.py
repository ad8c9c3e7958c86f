"""Files opened from the desktop that do not arrive in argv: macOS's QFileOpenEvent.

Finder ("Open With", a double-click on a .gguf, a drop on the Dock icon) starts the app
without the file in argv and sends a QFileOpenEvent to the QApplication instead, at
start-up or while Sprig runs. Linux and Windows pass the file in argv, which main.py and
single_instance.py handle. The filter keeps what arrives before the window exists and
hands it over once `deliver_to` is called.
"""

from collections.abc import Callable

from PySide6.QtCore import QEvent, QObject
from PySide6.QtGui import QFileOpenEvent


class FileOpenFilter(QObject):
    """An application event filter that turns FileOpen events into calls of one callback."""

    def __init__(self, parent: QObject | None = None):
        super().__init__(parent)
        self._pending: list[str] = []
        self._callback: Callable[[str], None] | None = None

    def deliver_to(self, callback: Callable[[str], None]) -> None:
        """Send every file opened so far, and every later one, to `callback(path)`."""
        self._callback = callback
        pending, self._pending = self._pending, []
        for path in pending:
            callback(path)

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        if event.type() != QEvent.Type.FileOpen or not isinstance(event, QFileOpenEvent):
            return super().eventFilter(watched, event)
        path = event.file() or event.url().toLocalFile()
        if path:
            if self._callback is None:
                self._pending.append(path)
            else:
                self._callback(path)
        return True
