"""`sprig --self-test`, as the packaged app will run it: headless, exit status 0."""

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_self_test_loads_the_default_model_answers_and_exits_zero():
    env = {k: v for k, v in os.environ.items() if k != "QT_QPA_PLATFORM"}  # it must go headless itself
    result = subprocess.run([sys.executable, "-m", "app", "--self-test"], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert [line.split(":")[0] for line in lines[:4]] == ["ok    window", "ok    storage", "ok    server", "ok    model"]
    assert "HTTP server answered" in lines[2]
    assert "Paris" in lines[3]
    assert lines[-1] == "self-test passed"
