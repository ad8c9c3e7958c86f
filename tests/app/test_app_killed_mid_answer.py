"""Kill the real app with SIGKILL in the middle of an answer: at most the last second is lost."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from app.storage import Store

DRIVER = Path(__file__).with_name("app_kill_driver.py")
REPO = DRIVER.parents[2]


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL (not on Windows)")
def test_answer_survives_a_real_kill_of_the_app(tmp_path):
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen", "PYTHONPATH": str(REPO)}
    process = subprocess.Popen([sys.executable, str(DRIVER), str(tmp_path)], stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL, text=True, env=env)
    updates: list[tuple[float, int]] = []  # (the app's clock, characters the window had shown)
    try:
        for line in process.stdout:
            clock, length = line.split()
            updates.append((float(clock), int(length)))
            if updates[-1][0] - updates[0][0] >= 3.0:  # three seconds into the answer
                break
        assert updates, "the app never started answering"
        os.kill(process.pid, signal.SIGKILL)
    finally:
        process.kill()
        process.wait()
    assert process.returncode == -signal.SIGKILL

    store = Store(tmp_path / "sprig.sqlite3")  # opening it is what the next app start does
    try:
        (conversation,) = store.conversations()
        user, assistant = store.messages(conversation.id)
    finally:
        store.close()
    assert user.content.startswith("Write a very long story")
    assert assistant.state == "interrupted"
    last_clock = updates[-1][0]
    shown_a_second_before = max(length for clock, length in updates if clock <= last_clock - 1.0)
    assert len(assistant.content) >= shown_a_second_before > 0
