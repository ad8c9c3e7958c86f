"""The "Local server" switch: the model loaded in the window, served over the OpenAI API.

The server shares the chat controller's scheduler, so the chat and the server's requests
take turns on the one model (the chat first), each with its own KV cache. While a model
loads or after it is unloaded the server stays up and answers 503. No widgets here: the
window connects `ServerPanel` to these signals.
"""

import shlex

from PySide6.QtCore import QObject, QTimer, Signal

from app.chat_controller import ChatController
from engine.server.app import ServerConfig, ServerState
from engine.server.completions import ServedModel
from engine.server.serve import BackgroundServer

DEFAULT_PORT = 8080
POLL_MS = 500


class LocalServer(QObject):
    """Starts and stops the server on 127.0.0.1 and follows the controller's model."""

    running_changed = Signal(bool)
    counts_changed = Signal(int, int)  # requests received, requests waiting for the model
    error = Signal(str)

    def __init__(self, controller: ChatController, port: int = DEFAULT_PORT, parent: QObject | None = None):
        super().__init__(parent)
        self.controller = controller
        self.port = port
        self.state: ServerState | None = None
        self.server: BackgroundServer | None = None
        self._counts = (-1, -1)
        self._timer = QTimer(self, interval=POLL_MS)
        self._timer.timeout.connect(self._poll)
        controller.model_loading.connect(self._detach)
        controller.model_unloaded.connect(self._detach)
        controller.model_loaded.connect(self._attach)

    @property
    def running(self) -> bool:
        """Whether the server is listening."""
        return self.server is not None

    @property
    def address(self) -> str:
        """The API's base URL, e.g. http://127.0.0.1:8080/v1 ("" when off)."""
        return self.server.url if self.server else ""

    @property
    def model_name(self) -> str:
        """The model's name in the API ("" while none is served)."""
        served = self.state.served if self.state else None
        return served.name if served else ""

    def curl_example(self) -> str:
        """A command that asks the served model something, ready to paste in a terminal."""
        if not self.running:
            return ""
        body = '{"model": "%s", "messages": [{"role": "user", "content": "Hello!"}]}' % (self.model_name or "local")
        return f"curl {self.address}/chat/completions -H 'Content-Type: application/json' -d {shlex.quote(body)}"

    def set_running(self, on: bool) -> None:
        """Turn the server on (on 127.0.0.1:port) or off; a port in use becomes an error."""
        if on == self.running:
            return
        if on:
            self.state = ServerState()
            try:
                self.server = BackgroundServer(self.state, ServerConfig(host="127.0.0.1", port=self.port)).start()
            except OSError as exc:
                self.state, self.server = None, None
                self.error.emit(f"The local server could not start: {exc}.")
                self.running_changed.emit(False)
                return
            self._attach()
            self._timer.start()
        elif self.server is not None:
            self._timer.stop()
            self.server.stop()
            self.state, self.server = None, None
        self._counts = (-1, -1)
        self.running_changed.emit(self.running)
        self._poll()

    def _attach(self, *_info) -> None:
        c = self.controller
        if self.state is not None and c.loaded is not None and c.scheduler is not None:
            self.state.served = ServedModel(c.loaded, c.scheduler, c.loaded.path.stem, c.settings.context_length)

    def _detach(self, *_args) -> None:
        if self.state is not None:
            self.state.served = None

    def _poll(self) -> None:
        served = self.state.served if self.state else None
        waiting = served.scheduler.waiting if served else 0
        counts = (self.state.requests_total if self.state else 0, waiting)
        if counts != self._counts:
            self._counts = counts
            self.counts_changed.emit(*counts)
