"""`sprig --version`: the version, the backend this machine gets, and why not the others."""

import subprocess
import sys

from backends.cuda.probe import probe, unavailable_reason


def test_version_names_the_backend_and_why_cuda_was_passed_over():
    result = subprocess.run(
        [sys.executable, "-m", "app", "--version"], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("Sprig ") and lines[1].startswith("backend: ")
    reason = unavailable_reason(probe())
    if reason is None:  # a machine where CUDA can run: auto takes it
        assert lines[1].startswith("backend: cuda · ")
    else:  # the sentence the probe gives is the one the user reads
        assert f"  {reason}" in lines
