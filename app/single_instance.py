"""One Sprig per chats database.

Two windows on one database would fight: opening the store marks any answer still
"streaming" as interrupted (the other window's live answer), and both would save the same
settings. So the first Sprig takes a lock file next to the database and listens on a local
socket. A later launch hands its model argument (if any) to that one, which comes to the
front and loads it, and then exits, as desktop apps do when opened twice. A lock left by
a killed Sprig is stale (its process is gone) and is taken over.
"""

import hashlib
import time
from pathlib import Path

from PySide6.QtCore import QLockFile, QObject, Signal
from PySide6.QtNetwork import QLocalServer, QLocalSocket

LOCK_NAME = "sprig.lock"
HAND_OVER_TIMEOUT_S = 5.0  # the running Sprig may still be starting up
STALE_AFTER_MS = 2**31 - 1  # a live Sprig's lock never goes stale by age (a dead one's does at once)


def server_name(folder: Path) -> str:
    """The local socket name of the Sprig that owns `folder`."""
    return "sprig-" + hashlib.sha256(str(folder.resolve()).encode()).hexdigest()[:16]


class SingleInstance(QObject):
    """The lock and the listening socket of the running Sprig for one data folder."""

    activated = Signal(str)  # a later launch asked for this model path ("" for none)

    def __init__(self, folder: Path, parent: QObject | None = None):
        super().__init__(parent)
        self.folder = folder
        self._lock = QLockFile(str(folder / LOCK_NAME))
        self._lock.setStaleLockTime(STALE_AFTER_MS)
        self._server = QLocalServer(self)
        self._server.newConnection.connect(self._on_connection)

    def acquire(self) -> bool:
        """Become the running Sprig for the folder; False if another one already is."""
        if not self._lock.tryLock(0):
            return False
        name = server_name(self.folder)
        QLocalServer.removeServer(name)  # a socket left behind by a killed Sprig
        self._server.listen(name)  # if this fails, later launches are refused, not handed over
        return True

    def release(self) -> None:
        """Stop listening and drop the lock (also done by the OS if the process dies)."""
        self._server.close()
        self._lock.unlock()

    def _on_connection(self) -> None:
        while self._server.hasPendingConnections():
            socket = self._server.nextPendingConnection()
            received = bytearray()

            def read(socket: QLocalSocket = socket, received: bytearray = received) -> None:
                received.extend(socket.readAll().data())
                if received.endswith(b"\n"):
                    self.activated.emit(received[:-1].decode("utf-8", "replace"))
                    socket.disconnectFromServer()

            socket.readyRead.connect(read)
            socket.disconnected.connect(socket.deleteLater)
            if socket.bytesAvailable():
                read()


def hand_over(folder: Path, model: str | None, timeout_s: float = HAND_OVER_TIMEOUT_S) -> bool:
    """Ask the Sprig running on `folder` to come to the front and load `model`.

    False if none answered within `timeout_s` (it may be hung, or still starting up).
    """
    message = (str(Path(model).resolve()) if model else "").encode("utf-8") + b"\n"
    deadline = time.monotonic() + timeout_s
    while True:
        socket = QLocalSocket()
        socket.connectToServer(server_name(folder))
        if socket.waitForConnected(1000):
            socket.write(message)
            sent = socket.waitForBytesWritten(1000)
            socket.waitForDisconnected(1000)  # the running Sprig hangs up once it has read it
            return sent
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)


def claim_or_hand_over(folder: Path, model: str | None) -> tuple[SingleInstance | None, str | None]:
    """Start as the Sprig for `folder`, or pass `model` to the one already running.

    Returns (instance, None) when this process is the first, (None, None) when the running
    Sprig took the request, and (None, message) when it is there but does not answer.
    """
    instance = SingleInstance(folder)
    if instance.acquire():
        return instance, None
    if hand_over(folder, model):
        return None, None
    return None, (
        f"Sprig is already running with the chats in {folder}, but it does not answer. "
        "Close it (or end its process), then start Sprig again."
    )
