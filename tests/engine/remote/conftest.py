"""Real servers on loopback for the remote-model tests: Sprig's own, llama.cpp's, and the faulty one.

Sprig's (`python -m engine serve`) and llama.cpp's (`python -m llama_cpp.server`) run as
subprocesses on free ports. llama.cpp's comes from a separate venv, never the app's:
$SPRIG_PEER_PYTHON, else `.venv-peer` (`make peer-venv`); without one
its tests skip, saying why.
"""

import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx2
import pytest

from engine.bundled import resolve_model_path
from tests.engine.conftest import peer_python
from tests.engine.remote.faulty_server import FaultyServer
from tests.gguf_factory import write_tiny_model

ROOT = Path(__file__).resolve().parents[3]
START_SECONDS = 120


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(command: list[str], port: int, log: Path) -> subprocess.Popen:
    """Start `command` and wait until /v1/models answers on `port`; fail with its log if it does not."""
    with log.open("wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
    deadline = time.monotonic() + START_SECONDS
    while time.monotonic() < deadline:
        if process.poll() is not None:
            break
        try:
            if httpx2.get(f"http://127.0.0.1:{port}/v1/models", timeout=2).status_code == 200:
                return process
        except httpx2.HTTPError:
            pass
        time.sleep(0.3)
    process.kill()
    pytest.fail(f"{command[2]} did not start:\n{log.read_text(errors='replace')[-3000:]}")


def stop_server(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(10)
    except subprocess.TimeoutExpired:
        process.kill()


@pytest.fixture(scope="session")
def smollm2() -> Path:
    """SmolLM2-135M: a real model, slow enough on numpy that a stream can be stopped in the middle."""
    return resolve_model_path("smollm2")


@pytest.fixture(scope="module")
def sprig_server(smollm2, tmp_path_factory):
    """`python -m engine serve` on SmolLM2; yields its base URL."""
    port = free_port()
    log = tmp_path_factory.mktemp("sprig-server") / "log.txt"
    command = [sys.executable, "-m", "engine", "serve", "--model", str(smollm2), "--backend", "numpy"]
    process = start_server([*command, "--port", str(port), "--alias", "smollm2"], port, log)
    yield f"http://127.0.0.1:{port}/v1"
    stop_server(process)


@pytest.fixture(scope="module")
def llama_server(tmp_path_factory):
    """llama.cpp's server (llama-cpp-python[server]) on a tiny model; yields its base URL."""
    python = peer_python("llama_cpp.server")
    if python is None:
        reason = "no Python with llama-cpp-python[server]: run `make peer-venv`, or set SPRIG_PEER_PYTHON"
        print(f"skipping llama.cpp server tests: {reason}")
        pytest.skip(reason)
    folder = tmp_path_factory.mktemp("llama-server")
    model = write_tiny_model(folder / "tiny.gguf", **{"qwen3.context_length": 1024})
    port = free_port()
    command = [python, "-m", "llama_cpp.server", "--model", str(model), "--port", str(port), "--n_ctx", "1024"]
    process = start_server(command, port, folder / "log.txt")
    yield f"http://127.0.0.1:{port}/v1"
    stop_server(process)


@pytest.fixture(scope="module")
def faulty():
    """The loopback server that plays the misbehaving ones."""
    server = FaultyServer()
    yield server
    server.close()
