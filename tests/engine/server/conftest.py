"""A server on loopback, on a port of its own, serving a tiny synthetic model (or SmolLM2)."""

import contextlib

import pytest

from engine.loader import load_model
from engine.server.app import ServerConfig, ServerState
from engine.server.completions import ServedModel
from engine.server.scheduler import Scheduler
from engine.server.serve import BackgroundServer
from tests.gguf_factory import write_tiny_model


@contextlib.contextmanager
def running_server(model_path, backend="numpy", *, n_ctx=1024, max_waiting=16, max_batch=4, **config):
    """Load `model_path`, serve it on 127.0.0.1 (a free port), and yield the BackgroundServer."""
    loaded = load_model(model_path, backend)
    scheduler = Scheduler(max_waiting=max_waiting, max_batch=max_batch)
    state = ServerState(ServedModel(loaded, scheduler, "tiny", n_ctx))
    server = BackgroundServer(state, ServerConfig(port=0, **config)).start()
    try:
        yield server
    finally:
        server.stop()
        scheduler.close()
        loaded.close()


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory):
    """A tiny Qwen3-shaped model with random weights and the ChatML template."""
    return write_tiny_model(tmp_path_factory.mktemp("server") / "tiny.gguf", **{"qwen3.context_length": 1024})


@pytest.fixture(scope="module")
def tiny_server(tiny_model_path):
    """A server on the tiny model, shared by a module's tests."""
    with running_server(tiny_model_path) as server:
        yield server
