"""Downloads from the (loopback) Hub: verified, resumed, refused and explained. No network is used."""

import hashlib
import os
import threading

import pytest

from engine.errors import (
    DiskSpaceError,
    DownloadIntegrityError,
    DownloadPaused,
    HubAccessError,
    HubError,
    HubOfflineError,
)
from engine.hub import tokens
from engine.hub.cache import cached_models, delete_download
from engine.hub.connection import Hub
from engine.hub.download import Pull, blob_path, download, partial_path, pending_pulls
from engine.hub.files import list_gguf_files
from engine.hub.search import search_models
from engine.keyring_store import SERVICE
from tests.hub_server import FakeRepo

REPO = "sprig-tests/random-GGUF"
DATA = {
    "random-Q4_K_M.gguf": os.urandom(600_000),
    "random-Q8_0.gguf": os.urandom(900_000),
    "README.md": b"# a model card\n",
}


@pytest.fixture
def repo(fake_hub):
    fake_hub.repos[REPO] = FakeRepo(dict(DATA), downloads=10, likes=3)
    return fake_hub.repos[REPO]


@pytest.fixture
def hub(tmp_path) -> Hub:
    return Hub(cache_dir=tmp_path / "hf", retry_wait_s=0.01)


def pull_of(hub: Hub, quant: str, repo_id: str = REPO) -> Pull:
    files = list_gguf_files(hub, repo_id)
    choice = files.find(quant)
    assert choice is not None
    return Pull.of(files, choice)


def finish(hub: Hub, pull: Pull, cancel: threading.Event | None = None):
    return list(download(hub, pull, cancel))[-1]


def test_search_lists_gguf_repositories_by_downloads_with_likes_and_licence(fake_hub, hub):
    fake_hub.repos["a/small-GGUF"] = FakeRepo({}, downloads=5, likes=1, license="mit")
    fake_hub.repos["b/small-GGUF"] = FakeRepo({}, downloads=50, likes=7)
    fake_hub.repos["c/other-GGUF"] = FakeRepo({}, downloads=500)
    found = search_models(hub, "small")
    assert [r.repo_id for r in found] == ["b/small-GGUF", "a/small-GGUF"]
    assert (found[1].likes, found[1].license, found[1].last_modified.year) == (1, "mit", 2025)
    search = next(q for m, p, q in fake_hub.requests if p == "/api/models")
    assert search is not None


def test_a_full_download_is_verified_and_lands_in_the_hf_cache_layout(repo, fake_hub, hub):
    pull = pull_of(hub, "Q8_0")
    last = finish(hub, pull)
    data = DATA["random-Q8_0.gguf"]
    assert last.stage == "done" and last.done == last.total == len(data)
    assert last.path == hub.cache_dir / f"models--sprig-tests--random-GGUF/snapshots/{repo.commit}/random-Q8_0.gguf"
    assert last.path.read_bytes() == data
    assert last.path.resolve() == blob_path(hub.cache_dir, REPO, pull.choice.parts[0])
    assert last.path.resolve().name == hashlib.sha256(data).hexdigest()
    assert (hub.cache_dir / "models--sprig-tests--random-GGUF/refs/main").read_text() == repo.commit
    assert pending_pulls(hub.cache_dir) == []
    # Never downloaded twice: a second pull finds it in the cache.
    assert finish(hub, pull).path == last.path
    assert len(fake_hub.file_requests("random-Q8_0.gguf")) == 1
    # The library of cached models lists it, with its size and where it lives.
    [cached] = cached_models(hub.cache_dir)
    assert (cached.repo_id, cached.quant, cached.path, cached.size) == (REPO, "Q8_0", last.path, len(data))


def test_a_connection_dropped_half_way_resumes_with_a_range_request(repo, fake_hub, hub):
    fake_hub.drop_after["random-Q8_0.gguf"] = 400_000
    last = finish(hub, pull_of(hub, "Q8_0"))
    assert last.path.read_bytes() == DATA["random-Q8_0.gguf"]
    first, second = fake_hub.file_requests("random-Q8_0.gguf")
    assert "range" not in first
    resumed_from = int(second["range"].removeprefix("bytes=").rstrip("-"))
    assert 0 < resumed_from <= 400_000


def test_a_paused_download_resumes_after_a_restart(repo, fake_hub, hub):
    fake_hub.chunk_delay_s = 0.03
    pull = pull_of(hub, "Q8_0")
    cancel = threading.Event()
    with pytest.raises(DownloadPaused, match=r"paused"):
        for progress in download(hub, pull, cancel):
            if progress.done > 0:
                assert progress.speed > 0 and progress.eta_s is not None
                cancel.set()
    kept = partial_path(hub.cache_dir, REPO, pull.choice.parts[0]).stat().st_size
    assert 0 < kept < len(DATA["random-Q8_0.gguf"])
    # A new process knows only what is on disk.
    [pending] = pending_pulls(hub.cache_dir)
    assert pending == pull
    fake_hub.chunk_delay_s = 0
    last = finish(hub, pending)
    assert last.path.read_bytes() == DATA["random-Q8_0.gguf"]
    assert fake_hub.file_requests("random-Q8_0.gguf")[-1]["range"] == f"bytes={kept}-"
    assert pending_pulls(hub.cache_dir) == []


def test_a_wrong_checksum_is_refused_and_the_file_removed(repo, fake_hub, hub):
    fake_hub.corrupt.add("random-Q8_0.gguf")
    pull = pull_of(hub, "Q8_0")
    with pytest.raises(
        DownloadIntegrityError, match=r"random-Q8_0.gguf is corrupt: its checksum .* the file was removed"
    ):
        finish(hub, pull)
    folder = hub.cache_dir / "models--sprig-tests--random-GGUF"
    assert not [p for p in folder.rglob("*") if p.is_file() and not p.name.endswith(".pull.json")]
    assert cached_models(hub.cache_dir) == []


def test_a_truncated_download_is_refused_and_removed(repo, fake_hub, hub):
    repo.sizes["random-Q8_0.gguf"] = len(DATA["random-Q8_0.gguf"]) + 1000  # the Hub's record is longer
    with pytest.raises(DownloadIntegrityError, match=r"arrived truncated"):
        finish(hub, pull_of(hub, "Q8_0"))
    assert not list((hub.cache_dir / "models--sprig-tests--random-GGUF/blobs").glob("*.incomplete"))
    assert cached_models(hub.cache_dir) == []


def test_a_gated_repository_asks_for_a_token_then_downloads_with_it(fake_hub, hub, memory_keyring, caplog):
    fake_hub.repos["sprig-tests/gated-GGUF"] = FakeRepo(
        {"gated-Q4_K_M.gguf": DATA["random-Q4_K_M.gguf"]}, token="hf_s3cret"
    )
    pull = pull_of(hub, "Q4_K_M", "sprig-tests/gated-GGUF")
    with pytest.raises(HubAccessError) as refused:
        finish(hub, pull)
    message = str(refused.value)
    assert "gated" in message and f"{hub.endpoint}/sprig-tests/gated-GGUF" in message and "token" in message
    tokens.save_token("hf_s3cret")
    assert memory_keyring.saved == {(SERVICE, tokens.ACCOUNT): "hf_s3cret"}
    with_token = Hub(cache_dir=hub.cache_dir, token=tokens.stored_token(), retry_wait_s=0.01)
    assert finish(with_token, pull).path.read_bytes() == DATA["random-Q4_K_M.gguf"]
    assert "hf_s3cret" not in caplog.text
    tokens.forget_token()
    assert tokens.stored_token() is None


def test_a_missing_repository_or_file_says_404(fake_hub, repo, hub):
    with pytest.raises(HubError, match=r"sprig-tests/nothing was not found .*404.*Check the name"):
        list_gguf_files(hub, "sprig-tests/nothing")
    pull = pull_of(hub, "Q8_0")
    del repo.files["random-Q8_0.gguf"]  # gone from the Hub since it was listed
    with pytest.raises(HubError, match=r"has no file random-Q8_0.gguf"):
        finish(hub, pull)


def test_429_is_retried_then_succeeds(repo, fake_hub, hub):
    fake_hub.fail = {"search": [429], "info": [429, 503], "resolve": [429, 429]}
    assert [r.repo_id for r in search_models(hub, "random")] == [REPO]
    last = finish(hub, pull_of(hub, "Q4_K_M"))
    assert last.path.read_bytes() == DATA["random-Q4_K_M.gguf"]
    assert fake_hub.fail == {"search": [], "info": [], "resolve": []}


@pytest.mark.parametrize(("status", "words"), [(429, "limiting requests"), (503, "server error \\(503\\)")])
def test_429_and_5xx_that_persist_end_in_a_message(repo, fake_hub, hub, status, words):
    fake_hub.fail = {"info": [status] * 10}
    with pytest.raises(HubError, match=rf"{words}.*even after several retries"):
        list_gguf_files(hub, REPO)


def test_the_disk_space_check_refuses_before_downloading(fake_hub, hub):
    fake_hub.repos["sprig-tests/huge-GGUF"] = FakeRepo(
        {"huge-Q4_K_M.gguf": b"x" * 1000}, sizes={"huge-Q4_K_M.gguf": 2**60}
    )
    with pytest.raises(DiskSpaceError, match=r"Not enough disk space for sprig-tests/huge-GGUF:Q4_K_M: it needs"):
        finish(hub, pull_of(hub, "Q4_K_M", "sprig-tests/huge-GGUF"))
    assert fake_hub.file_requests("huge-Q4_K_M.gguf") == []


def test_offline_lists_what_is_cached_and_says_search_needs_a_network(repo, hub):
    finish(hub, pull_of(hub, "Q4_K_M"))
    offline = Hub(cache_dir=hub.cache_dir, offline=True)
    with pytest.raises(HubOfflineError, match=r"Offline mode is on .* need the network"):
        search_models(offline, "random")
    assert [m.quant for m in cached_models(offline.cache_dir)] == ["Q4_K_M"]


def test_no_network_says_so(tmp_path):
    unreachable = Hub(cache_dir=tmp_path, endpoint="http://127.0.0.1:9", retry_wait_s=0.01)  # discard port: refused
    with pytest.raises(HubOfflineError, match=r"Cannot reach the Hugging Face Hub .*no network"):
        list_gguf_files(unreachable, "sprig-tests/random-GGUF")


def test_a_repository_without_gguf_files_says_so(fake_hub, hub):
    fake_hub.repos["sprig-tests/safetensors-only"] = FakeRepo({"model.safetensors": b"x", "mmproj-F16.gguf": b"y"})
    with pytest.raises(HubError, match=r"has no GGUF file: Sprig runs GGUF models only"):
        list_gguf_files(hub, "sprig-tests/safetensors-only")


def test_split_files_are_one_model_downloaded_whole(fake_hub, hub):
    parts = {f"big-Q4_K_M-0000{i}-of-00003.gguf": os.urandom(100_000 + i) for i in (1, 2, 3)}
    fake_hub.repos["sprig-tests/split-GGUF"] = FakeRepo({**parts, "big-Q8_0.gguf": b"z" * 10})
    files = list_gguf_files(hub, "sprig-tests/split-GGUF")
    assert [(c.quant, len(c.parts), c.size) for c in files.choices] == [
        ("Q4_K_M", 3, sum(map(len, parts.values()))),
        ("Q8_0", 1, 10),
    ]
    assert files.choices[0].name == "big-Q4_K_M-00001-of-00003.gguf (+2 parts)"
    last = finish(hub, Pull.of(files, files.choices[0]))
    assert last.path.name == "big-Q4_K_M-00001-of-00003.gguf"
    for name, data in parts.items():
        assert (last.path.parent / name).read_bytes() == data
    [cached] = cached_models(hub.cache_dir)
    assert (cached.name, len(cached.parts), cached.size) == ("big-Q4_K_M", 3, files.choices[0].size)


def test_deleting_a_download_frees_its_files(repo, hub):
    finish(hub, pull_of(hub, "Q4_K_M"))
    finish(hub, pull_of(hub, "Q8_0"))
    q4, q8 = cached_models(hub.cache_dir)
    delete_download(hub.cache_dir, q4)
    assert not q4.path.exists() and not q4.blobs[0].exists()
    assert cached_models(hub.cache_dir) == [q8]
    delete_download(hub.cache_dir, q8)
    assert not (hub.cache_dir / "models--sprig-tests--random-GGUF").exists()
