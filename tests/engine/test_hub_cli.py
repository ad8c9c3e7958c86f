"""`python -m engine pull` and `sprig pull` against the loopback Hub: progress, checks, the local path."""

import subprocess
import sys
from pathlib import Path

import pytest

from app.main import main as sprig_main
from engine.model_info import read_model_info
from tests.hub_server import tiny_model_repo

ROOT = Path(__file__).resolve().parents[2]
REPO = "sprig-tests/tiny-qwen3-GGUF"


@pytest.fixture
def repo(fake_hub, tmp_path):
    fake_hub.repos[REPO] = tiny_model_repo(tmp_path)
    return fake_hub.repos[REPO]


def test_engine_pull_downloads_checks_and_prints_the_local_path(repo, tmp_path):
    cache = tmp_path / "hf"
    done = subprocess.run(
        [sys.executable, "-m", "engine", "pull", f"{REPO}:q8_0", "--cache-dir", str(cache)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    path = Path(done.stdout.strip())
    assert path == cache / f"models--sprig-tests--tiny-qwen3-GGUF/snapshots/{repo.commit}/tiny-qwen3-Q8_0.gguf"
    assert path.read_bytes() == repo.files["tiny-qwen3-Q8_0.gguf"]
    assert read_model_info(path).architecture == "qwen3"  # a model the library can load
    assert f"{REPO}:Q8_0: tiny-qwen3-Q8_0.gguf" in done.stderr and "100%" in done.stderr  # the progress bar


def test_sprig_pull_is_the_same_command(repo, tmp_path, capsys):
    repo.files["tiny-qwen3-Q4_K_M.gguf"] = repo.files.pop("tiny-qwen3-F32.gguf")  # the default pick
    assert sprig_main(["pull", REPO, "--cache-dir", str(tmp_path / "hf")]) == 0
    path = Path(capsys.readouterr().out.strip())
    assert path.name == "tiny-qwen3-Q4_K_M.gguf" and path.read_bytes() == repo.files[path.name]


def test_pull_names_the_choices_when_the_quantization_is_missing(repo, tmp_path, capsys):
    assert sprig_main(["pull", f"{REPO}:Q2_K", "--cache-dir", str(tmp_path / "hf")]) == 2
    err = capsys.readouterr().err
    assert f"error: {REPO} has no Q2_K file; name one of: {REPO}:F32" in err and f"{REPO}:Q8_0" in err
    assert not (tmp_path / "hf").exists() or not list((tmp_path / "hf").rglob("*.gguf"))


def test_pull_of_a_missing_repository_says_404(fake_hub, tmp_path, capsys):
    assert sprig_main(["pull", "sprig-tests/absent", "--cache-dir", str(tmp_path / "hf")]) == 2
    assert "error: sprig-tests/absent was not found on the Hugging Face Hub (404)" in capsys.readouterr().err
