"""One Sprig per chats database: a second launch hands its model to the running window."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from app.single_instance import LOCK_NAME, claim_or_hand_over

REPO = Path(__file__).parents[2]
TINY_QWEN3 = REPO / "tests/fixtures/models/tiny-qwen3-f32.gguf"
ENV = {**os.environ, "QT_QPA_PLATFORM": "offscreen", "PYTHONPATH": str(REPO)}
HOLD_LOCK = """
import sys, time
from PySide6.QtCore import QLockFile
lock = QLockFile(sys.argv[1])
print(lock.tryLock(0), flush=True)
time.sleep(600)
"""


def last_model(data: Path) -> str | None:
    """The model the running app last loaded, from the settings it saves on each load."""
    try:
        return json.loads((data / "settings.json").read_text()).get("last_model")
    except (OSError, ValueError):
        return None


def wait_for(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def hold_lock(folder: Path) -> subprocess.Popen:
    """Another process holding the lock without listening (a hung or starting Sprig)."""
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(folder / LOCK_NAME)],
                              stdout=subprocess.PIPE, text=True, env=ENV)
    assert holder.stdout.readline().strip() == "True"
    return holder


def test_a_second_launch_hands_its_model_to_the_running_window(tmp_path):
    data = tmp_path / "data"
    first = subprocess.Popen([sys.executable, "-m", "app", "--data-dir", str(data)], cwd=REPO, env=ENV,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: last_model(data) is not None, 120, "the first window to load its model")
        assert "smollm2" in last_model(data).lower()
        second = subprocess.run([sys.executable, "-m", "app", "--data-dir", str(data), str(TINY_QWEN3)],
                                cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=60)
        assert second.returncode == 0, second.stderr
        wait_for(lambda: last_model(data) == str(TINY_QWEN3), 60, "the first window to load the handed model")
        assert first.poll() is None  # the first window is still running, now on the tiny model
    finally:
        first.kill()
        first.wait()


def test_a_lock_left_by_a_killed_sprig_is_taken_over(qapp, tmp_path):
    holder = hold_lock(tmp_path)
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    assert (tmp_path / LOCK_NAME).exists()  # left behind
    instance, refusal = claim_or_hand_over(tmp_path, None)
    assert instance is not None and refusal is None
    instance.release()


@pytest.mark.timeout(60)
def test_a_running_sprig_that_does_not_answer_gets_a_clear_refusal(qapp, tmp_path):
    holder = hold_lock(tmp_path)
    try:
        instance, refusal = claim_or_hand_over(tmp_path, str(TINY_QWEN3))
    finally:
        holder.kill()
        holder.wait()
    assert instance is None
    assert "already running" in refusal and str(tmp_path) in refusal
