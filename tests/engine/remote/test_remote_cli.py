"""`python -m engine generate --endpoint`: a server's answer on stdout, a failure as one line and status 2."""

import subprocess
import sys

from tests.engine.remote.conftest import ROOT, free_port


def generate(*args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "engine", "generate", *args]
    return subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=120)


def test_generate_streams_a_remote_answer_to_stdout(sprig_server):
    done = generate("--endpoint", sprig_server, "--model", "smollm2", "--prompt", "Hi", "--max-tokens", "5")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip()


def test_a_failure_is_the_apps_one_line_and_no_traceback(faulty):
    done = generate("--endpoint", faulty.url("429"), "--api-key", "sk-secret", "--model", "m", "--prompt", "Hi")
    assert done.returncode == 2
    assert done.stderr.startswith(f"error: {faulty.url('429')} is rate-limiting requests (HTTP 429): try again in 7 s")
    assert "Traceback" not in done.stderr and "sk-secret" not in done.stderr


def test_a_cut_stream_keeps_its_text_on_stdout(faulty):
    done = generate("--endpoint", faulty.url("cut"), "--model", "m", "--prompt", "Hi")
    assert (done.returncode, done.stdout) == (2, "Half an answer")
    assert "closed the connection in the middle" in done.stderr


def test_nothing_listening(tmp_path):
    done = generate("--endpoint", f"http://127.0.0.1:{free_port()}/v1", "--model", "m", "--prompt", "Hi")
    assert done.returncode == 2 and "refused the connection" in done.stderr.splitlines()[-1]
