"""Fixtures shared by the engine tests that run llama.cpp itself."""

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent
PEER_PYTHONS = (os.environ.get("SPRIG_PEER_PYTHON"), ROOT / ".venv-peer/bin/python")


def peer_python(module: str = "llama_cpp") -> str | None:
    """A Python that can import `module` of llama-cpp-python (`llama_cpp.server`: its server extra), or None."""
    for candidate in PEER_PYTHONS:
        if not candidate or not Path(candidate).exists():
            continue
        if subprocess.run([str(candidate), "-c", f"import {module}"], capture_output=True).returncode == 0:
            return str(candidate)
    return None


@pytest.fixture(scope="module")
def peer(request):
    """The peer's Python (llama-cpp-python); without one the module's tests skip, saying why."""
    python = peer_python()
    if python is None:
        reason = "no Python with llama-cpp-python: run `make peer-venv`, or set SPRIG_PEER_PYTHON"
        print(f"skipping {request.module.__name__}'s llama.cpp tests: {reason}")
        pytest.skip(reason)
    return python
