"""The "Local server" switch: the model loaded in the window, served over the OpenAI API.

It listens on 127.0.0.1, or on every interface ("reachable from this network", only with an
API key), on the settings' port, with their CORS origins; the key comes from the keyring
(app/server_key.py) when the server starts.

The server shares the model host's scheduler, so the chat and the server's requests
take turns on the one model (the chat first), each with its own KV cache. While a model
loads or after it is unloaded the server stays up and answers 503. No widgets here: the
window connects `ServerPanel` to these signals.
"""

import re
import shlex

from PySide6.QtCore import QObject, QTimer, Signal

from app.chat_controller import ChatController
from app.server_key import ServerKeyError, stored_key
from app.settings import Settings
from engine.server.app import ServerConfig, ServerState
from engine.server.completions import ServedModel
from engine.server.serve import BackgroundServer

POLL_MS = 500
EVERY_INTERFACE = "0.0.0.0"
NETWORK_NEEDS_KEY = (
    "The server cannot be reachable from this network without an API key: anyone on the network could use "
    "the model. Set a key in the server settings, or keep the server on this computer."
)
MASK = "••••••••"


def parse_origins(text: str) -> list[str]:
    """The CORS origins in `text`, separated by commas or spaces."""
    return [origin for origin in re.split(r"[\s,]+", text) if origin]


def server_config(settings: Settings, key: str | None, port: int) -> ServerConfig:
    """How the server listens for `settings` and `key`; raises ServerKeyError for the network without a key."""
    if settings.server_network and not key:
        raise ServerKeyError(NETWORK_NEEDS_KEY)
    host = EVERY_INTERFACE if settings.server_network else "127.0.0.1"
    return ServerConfig(host=host, port=port, api_key=key, cors_origins=parse_origins(settings.server_origins))


class LocalServer(QObject):
    """Starts and stops the server and follows the controller's model.

    `port` None listens on the settings' port."""

    running_changed = Signal(bool)
    served_changed = Signal()  # another model (or none) is served: the example changes
    counts_changed = Signal(int, int)  # requests received, requests waiting for the model
    error = Signal(str)

    def __init__(self, controller: ChatController, port: int | None = None, parent: QObject | None = None):
        super().__init__(parent)
        self.controller = controller
        self.port = port
        self.state: ServerState | None = None
        self.server: BackgroundServer | None = None
        self._counts = (-1, -1)
        self._timer = QTimer(self, interval=POLL_MS)
        self._timer.timeout.connect(self._poll)
        models = controller.models
        models.model_loading.connect(self._detach)
        models.model_unloaded.connect(self._detach)
        models.remote_model_chosen.connect(self._detach)  # the local model is let go
        models.model_loaded.connect(self._attach)

    @property
    def running(self) -> bool:
        """Whether the server is listening."""
        return self.server is not None

    @property
    def address(self) -> str:
        """The API's base URL, e.g. http://127.0.0.1:8080/v1 ("" when off); on every interface,
        its local address."""
        return self.server.url.replace(EVERY_INTERFACE, "127.0.0.1") if self.server else ""

    @property
    def on_network(self) -> bool:
        """Whether it listens on every interface."""
        return self.server is not None and self.server.config.host == EVERY_INTERFACE

    @property
    def model_name(self) -> str:
        """The model's name in the API ("" while none is served)."""
        served = self.state.served if self.state else None
        return served.name if served else ""

    def curl_example(self, masked: bool = False) -> str:
        """A command that asks the served model something, ready to paste in a terminal; with the key
        header when a key is set (`masked`: the key hidden, for the screen)."""
        if self.server is None:
            return ""
        body = '{"model": "%s", "messages": [{"role": "user", "content": "Hello!"}]}' % (self.model_name or "local")
        key = self.server.config.api_key
        auth = f" -H {shlex.quote('Authorization: Bearer ' + (MASK if masked else key))}" if key else ""
        return f"curl {self.address}/chat/completions -H 'Content-Type: application/json'{auth} -d {shlex.quote(body)}"

    def set_running(self, on: bool) -> None:
        """Turn the server on (as the settings say) or off; a port in use, or the network without a
        key, becomes an error."""
        if on == self.running:
            return
        if on:
            settings = self.controller.settings
            self.state = ServerState()
            try:
                config = server_config(settings, stored_key(), settings.server_port if self.port is None else self.port)
                self.server = BackgroundServer(self.state, config).start()
            except (OSError, ServerKeyError) as exc:
                self.state, self.server = None, None
                reason = str(exc) if isinstance(exc, ServerKeyError) else f"The local server could not start: {exc}."
                self.error.emit(reason)
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
        m = self.controller.models
        if self.state is not None and m.loaded is not None and m.scheduler is not None:
            context = m.effective_settings.context_length
            self.state.served = ServedModel(m.loaded, m.scheduler, m.loaded.path.stem, context)
            self.served_changed.emit()

    def _detach(self, *_args) -> None:
        if self.state is not None:
            self.state.served = None
            self.served_changed.emit()

    def restart(self) -> None:
        """Start again with the current settings and key, if it runs."""
        if self.running:
            self.set_running(False)
            self.set_running(True)

    def _poll(self) -> None:
        served = self.state.served if self.state else None
        waiting = served.scheduler.waiting if served else 0
        counts = (self.state.requests_total if self.state else 0, waiting)
        if counts != self._counts:
            self._counts = counts
            self.counts_changed.emit(*counts)
