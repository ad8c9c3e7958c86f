"""Running the server: on uvicorn in the foreground (`python -m engine serve`), or on a
thread of its own (the app's "Local server" switch, and the tests)."""

import logging
import threading

import uvicorn

from engine.server.app import ServerConfig, ServerState, create_app
from engine.server.security import check_bind

START_TIMEOUT = 10.0


def _uvicorn_config(state: ServerState, config: ServerConfig, log_level: str) -> uvicorn.Config:
    check_bind(config.host, config.api_key)
    return uvicorn.Config(
        create_app(state, config),
        host=config.host,
        port=config.port,
        log_level=log_level,
        lifespan="off",
        timeout_graceful_shutdown=2,
        server_header=False,
        access_log=False,
    )  # the request-id middleware logs each request


class BackgroundServer:
    """A uvicorn server on a daemon thread. `start()` returns once it listens (or raises)."""

    def __init__(self, state: ServerState, config: ServerConfig, log_level: str = "warning"):
        self.state, self.config = state, config
        self._server = uvicorn.Server(_uvicorn_config(state, config, log_level))
        self._thread = threading.Thread(target=self._server.run, name="sprig-server", daemon=True)

    def start(self) -> "BackgroundServer":
        """Start listening; raises OSError when the address cannot be bound."""
        self._thread.start()
        while not self._server.started:
            self._thread.join(0.02)
            if not self._thread.is_alive():
                raise OSError(
                    f"the server could not listen on {self.config.host}:{self.config.port} (is the port in use?)"
                )
        return self

    @property
    def port(self) -> int:
        """The port it listens on (the chosen one when started with port 0)."""
        return self._server.servers[0].sockets[0].getsockname()[1]

    @property
    def url(self) -> str:
        """Base URL of the API, e.g. http://127.0.0.1:8080/v1."""
        host = f"[{self.config.host}]" if ":" in self.config.host else self.config.host
        return f"http://{host}:{self.port}/v1"

    def stop(self, timeout: float = 10.0) -> None:
        """Stop accepting, end open connections, and wait for the thread."""
        self._server.should_exit = True
        self._thread.join(timeout)


def serve_forever(state: ServerState, config: ServerConfig, on_started=None) -> None:
    """Run the server in this thread until interrupted (Ctrl-C)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    server = uvicorn.Server(_uvicorn_config(state, config, "info"))
    if on_started is not None:
        threading.Thread(target=on_started, args=(server,), name="sprig-loader", daemon=True).start()
    server.run()
