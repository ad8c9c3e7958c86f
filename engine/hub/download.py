"""Resumable, verified downloads into the Hugging Face cache.

`huggingface_hub.hf_hub_download` writes each download to a file named for that process
and deletes it on any failure, so it cannot pause, nor resume after a restart of the
app, and it checks sizes but not checksums. This module does the transfer itself, in
the same cache layout, with the library's HTTP session, retries and errors:

    <cache>/models--owner--name/blobs/<sha256>.incomplete   the bytes so far (kept on pause)
    <cache>/models--owner--name/blobs/<sha256>.pull.json     what they belong to (to resume later)
    <cache>/models--owner--name/blobs/<sha256>                the verified file
    <cache>/models--owner--name/snapshots/<commit>/<path>     a link to it: the path Sprig loads

A download resumes with an HTTP Range request from the bytes on disk. A dropped
connection resumes by itself; 429 and 5xx are retried with growing waits. Every file's SHA-256 is
checked against the Hub's record before it is linked: a mismatch removes it and says so.
"""

import hashlib
import json
import os
import shutil
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx2
from huggingface_hub import constants, hf_hub_url
from huggingface_hub.file_download import are_symlinks_supported, repo_folder_name
from huggingface_hub.utils import build_hf_headers, hf_raise_for_status, http_stream_backoff

from engine.errors import DiskSpaceError, DownloadIntegrityError, DownloadPaused, HubError
from engine.hub.connection import RETRIES, RETRY_STATUSES, Hub, hub_errors
from engine.hub.files import GGUFChoice, RemoteFile, RepoFiles

CHUNK = 1 << 20
PROGRESS_INTERVAL_S = 0.1
SPEED_WINDOW_S = 3.0  # the speed shown is the average over about this long
DISK_MARGIN = 64 * 1024 * 1024  # free space to leave beyond the download itself
RECORD_SUFFIX = ".pull.json"


@dataclass(frozen=True)
class Pull:
    """One model to download: a choice of a repository at a commit."""

    repo_id: str
    commit: str
    choice: GGUFChoice

    @classmethod
    def of(cls, repo: RepoFiles, choice: GGUFChoice) -> "Pull":
        """The pull of `choice` from `repo`."""
        if not repo.commit:
            raise HubError(f"The Hub did not say which commit of {repo.repo_id} it lists; try again.")
        return cls(repo.repo_id, repo.commit, choice)

    @property
    def label(self) -> str:
        """How people name it: owner/name:QUANT."""
        return f"{self.repo_id}:{self.choice.quant}"

    def to_json(self) -> dict:
        """A JSON-ready record of the pull."""
        return {"repo_id": self.repo_id, "commit": self.commit, "choice": asdict(self.choice)}

    @classmethod
    def from_json(cls, data: dict) -> "Pull":
        """The pull a `to_json` record describes."""
        choice = data["choice"]
        parts = tuple(RemoteFile(**part) for part in choice["parts"])
        return cls(data["repo_id"], data["commit"], GGUFChoice(choice["quant"], parts))


@dataclass(frozen=True)
class Progress:
    """Where a pull stands: bytes on disk of all its parts, speed, and the path once done."""

    pull: Pull
    done: int
    total: int
    speed: float  # bytes per second, over the last few seconds
    stage: str = "downloading"  # or "verifying", or "done"
    path: Path | None = None  # the model's (first) file in the cache, once every part is verified

    @property
    def eta_s(self) -> float | None:
        """Seconds left at the current speed, if there is one."""
        return (self.total - self.done) / self.speed if self.speed > 0 else None


def repo_folder(cache_dir: Path, repo_id: str) -> Path:
    """The repository's folder in the cache (models--owner--name)."""
    return cache_dir / repo_folder_name(repo_id=repo_id, repo_type="model")


def blob_path(cache_dir: Path, repo_id: str, file: RemoteFile) -> Path:
    """Where the verified content of `file` lives in the cache."""
    return repo_folder(cache_dir, repo_id) / "blobs" / file.etag


def partial_path(cache_dir: Path, repo_id: str, file: RemoteFile) -> Path:
    """Where the bytes of `file` downloaded so far are kept."""
    return blob_path(cache_dir, repo_id, file).with_name(file.etag + ".incomplete")


def snapshot_path(cache_dir: Path, pull: Pull, file: RemoteFile) -> Path:
    """The path of `file` in the snapshot of `pull`'s commit: what loads."""
    return repo_folder(cache_dir, pull.repo_id) / "snapshots" / pull.commit / file.path


def record_path(cache_dir: Path, pull: Pull) -> Path:
    """Where the record of an unfinished pull is kept."""
    return blob_path(cache_dir, pull.repo_id, pull.choice.parts[0]).with_name(pull.choice.parts[0].etag + RECORD_SUFFIX)


def bytes_on_disk(cache_dir: Path, pull: Pull) -> int:
    """Bytes of `pull` already downloaded: whole parts and partial ones."""
    total = 0
    for part in pull.choice.parts:
        if snapshot_path(cache_dir, pull, part).exists() or blob_path(cache_dir, pull.repo_id, part).exists():
            total += part.size
        elif partial_path(cache_dir, pull.repo_id, part).exists():
            total += partial_path(cache_dir, pull.repo_id, part).stat().st_size
    return total


def pending_pulls(cache_dir: Path) -> list[Pull]:
    """Pulls paused or interrupted (by a closed app, a lost connection) that can resume."""
    pulls = []
    for record in sorted(cache_dir.glob(f"models--*/blobs/*{RECORD_SUFFIX}")):
        try:
            pulls.append(Pull.from_json(json.loads(record.read_text(encoding="utf-8"))))
        except (OSError, ValueError, KeyError, TypeError):
            continue  # a record that cannot be read cannot be resumed; its bytes stay until cancelled
    return pulls


def discard(cache_dir: Path, pull: Pull) -> None:
    """Cancel `pull` for good: remove its partial files and its record (finished parts stay)."""
    for part in pull.choice.parts:
        partial_path(cache_dir, pull.repo_id, part).unlink(missing_ok=True)
    record_path(cache_dir, pull).unlink(missing_ok=True)


def free_disk_bytes(folder: Path) -> int:
    """Free bytes on the disk that holds `folder` (or its nearest existing parent)."""
    for candidate in (folder, *folder.parents):
        if candidate.exists():
            return shutil.disk_usage(candidate).free
    return 0


def check_disk_space(cache_dir: Path, pull: Pull) -> None:
    """Raise DiskSpaceError if what is left to download does not fit on the cache's disk."""
    needed = pull.choice.size - bytes_on_disk(cache_dir, pull)
    free = free_disk_bytes(cache_dir)
    if needed + DISK_MARGIN > free:
        raise DiskSpaceError(
            f"Not enough disk space for {pull.label}: it needs {needed / 1e9:.2f} GB more and {cache_dir} has "
            f"{free / 1e9:.2f} GB free. Free some space, or move the Hugging Face cache to a larger disk "
            "(set HF_HUB_CACHE or HF_HOME)."
        )


def download(hub: Hub, pull: Pull, cancel: threading.Event | None = None) -> Iterator[Progress]:
    """Download every part of `pull` into the cache, verified; yields Progress, the last with `path`.

    Parts already in the cache are not downloaded again. Setting `cancel` stops at the
    next chunk with DownloadPaused, keeping the bytes so far (see `discard`). Raises
    DiskSpaceError before starting if the disk is too small, DownloadIntegrityError for a
    truncated or corrupt file (removed), and the HubErrors of `hub_errors`.
    """
    hub.check_online()
    cancel = cancel or threading.Event()
    cache = hub.cache_dir
    check_disk_space(cache, pull)
    record = record_path(cache, pull)
    record.parent.mkdir(parents=True, exist_ok=True)
    record.write_text(json.dumps(pull.to_json()), encoding="utf-8")
    meter = _Meter(pull, bytes_on_disk(cache, pull))
    for part in pull.choice.parts:
        with hub_errors(hub, pull.repo_id, part.path):
            yield from _download_part(hub, pull, part, cancel, meter)
    _write_ref(cache, pull)
    record.unlink(missing_ok=True)
    yield meter.progress("done", snapshot_path(cache, pull, pull.choice.parts[0]))


class _Meter:
    """Counts a pull's bytes and says, now and then, how fast they come."""

    def __init__(self, pull: Pull, done: int):
        self.pull, self.done = pull, done
        self._samples: list[tuple[float, int]] = [(time.monotonic(), done)]

    def add(self, n: int) -> bool:
        """Count `n` more bytes; True when it is time to report progress."""
        self.done += n
        now = time.monotonic()
        if now - self._samples[-1][0] < PROGRESS_INTERVAL_S:
            return False
        self._samples.append((now, self.done))
        while len(self._samples) > 2 and now - self._samples[0][0] > SPEED_WINDOW_S:
            self._samples.pop(0)
        return True

    def progress(self, stage: str = "downloading", path: Path | None = None) -> Progress:
        """The progress now."""
        (t0, b0), (t1, b1) = self._samples[0], self._samples[-1]
        speed = (b1 - b0) / (t1 - t0) if t1 > t0 else 0.0
        return Progress(self.pull, self.done, self.pull.choice.size, speed, stage, path)


def _download_part(
    hub: Hub, pull: Pull, part: RemoteFile, cancel: threading.Event, meter: _Meter
) -> Iterator[Progress]:
    """Download one file of `pull` (resuming its partial file), verify it, link it into the snapshot."""
    cache = hub.cache_dir
    blob, partial, pointer = (
        blob_path(cache, pull.repo_id, part),
        partial_path(cache, pull.repo_id, part),
        snapshot_path(cache, pull, part),
    )
    if pointer.exists() and pointer.stat().st_size == part.size:
        return
    if not blob.exists():
        yield from _transfer(hub, pull, part, partial, cancel, meter)
        yield meter.progress("verifying")
        _verify(partial, part)
        partial.replace(blob)
    _link(cache, blob, pointer)


def _transfer(
    hub: Hub, pull: Pull, part: RemoteFile, partial: Path, cancel: threading.Event, meter: _Meter
) -> Iterator[Progress]:
    """Fetch the bytes of `part` missing from `partial`, resuming after dropped connections.

    The URL names the commit, so its content cannot change between two requests: a
    Range request continues where the bytes on disk end (no If-Range, whose ETag the
    Hub's CDN would not know), and the checksum catches anything else.
    """
    url = hf_hub_url(pull.repo_id, part.path, revision=pull.commit, endpoint=hub.endpoint)
    failures = 0  # tries in a row that brought no bytes
    while (offset := partial.stat().st_size if partial.exists() else 0) < part.size:
        _check_cancel(cancel, pull, meter)
        headers = build_hf_headers(token=hub.token)
        if offset:
            headers["Range"] = f"bytes={offset}-"
        received = 0
        try:
            with http_stream_backoff(
                "GET",
                url,
                headers=headers,
                timeout=constants.HF_HUB_DOWNLOAD_TIMEOUT,
                max_retries=RETRIES,
                base_wait_time=hub.retry_wait_s,
                retry_on_exceptions=(),  # network errors are retried below, resuming
                retry_on_status_codes=RETRY_STATUSES,
            ) as response:
                hf_raise_for_status(response)
                if offset and response.status_code != 206:  # the server ignored the range: start over
                    meter.done -= offset
                    offset = 0
                with _open_partial(partial, offset) as out:
                    for chunk in response.iter_bytes():  # as the bytes arrive: a drop loses none
                        _check_cancel(cancel, pull, meter)
                        _write(out, chunk, partial, pull)
                        received += len(chunk)
                        if meter.add(len(chunk)):
                            yield meter.progress()
        except httpx2.TransportError:
            if not received and failures >= RETRIES:
                raise
        failures = 0 if received else failures + 1
        if failures > RETRIES:
            return  # the server keeps ending the file early: _verify says it is truncated
        if failures:
            time.sleep(hub.retry_wait_s * 2 ** (failures - 1))


def _check_cancel(cancel: threading.Event, pull: Pull, meter: _Meter) -> None:
    """Raise DownloadPaused if the user paused or cancelled."""
    if cancel.is_set():
        raise DownloadPaused(f"{pull.label} paused: {meter.done / 1e6:.0f} MB kept to resume.")


def _open_partial(partial: Path, offset: int):
    """The partial file opened to write at `offset` (0: from scratch)."""
    partial.parent.mkdir(parents=True, exist_ok=True)
    out = partial.open("r+b" if offset and partial.exists() else "wb")
    out.seek(offset)
    out.truncate()
    return out


def _write(out, chunk: bytes, partial: Path, pull: Pull) -> None:
    """Write a chunk; a full disk removes the partial file and says so."""
    try:
        out.write(chunk)
    except OSError as exc:
        out.close()
        partial.unlink(missing_ok=True)
        raise DiskSpaceError(
            f"The disk filled up while downloading {pull.label} ({exc.strerror}); the unfinished file was removed. "
            "Free some space and download it again."
        ) from exc


def _verify(partial: Path, part: RemoteFile) -> None:
    """Check the size and checksum of a finished download; remove it and raise if either is wrong."""
    size = partial.stat().st_size if partial.exists() else 0
    if size != part.size:
        partial.unlink(missing_ok=True)
        raise DownloadIntegrityError(
            f"{part.path} arrived truncated ({size:,} of {part.size:,} bytes) after several tries; the file was "
            "removed. Check the connection and download it again."
        )
    digest = _file_digest(partial, git_blob=part.sha256 is None)
    if digest != part.etag:
        partial.unlink(missing_ok=True)
        raise DownloadIntegrityError(
            f"{part.path} is corrupt: its checksum ({digest[:12]}…) differs from the Hub's ({part.etag[:12]}…), so "
            "the file was removed. Download it again; if it happens again, the file on the Hub may be changing."
        )


def _file_digest(path: Path, git_blob: bool) -> str:
    """SHA-256 of the file, or its git blob id (SHA-1 of a 'blob <size>' header and the content)."""
    digest = hashlib.sha1(f"blob {path.stat().st_size}\0".encode()) if git_blob else hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(CHUNK):
            digest.update(block)
    return digest.hexdigest()


def _link(cache_dir: Path, blob: Path, pointer: Path) -> None:
    """Make the snapshot's path point at the blob, as huggingface_hub does (a move where links cannot be made)."""
    pointer.parent.mkdir(parents=True, exist_ok=True)
    pointer.unlink(missing_ok=True)
    if are_symlinks_supported(cache_dir):
        pointer.symlink_to(os.path.relpath(blob, pointer.parent))
    else:
        blob.replace(pointer)


def _write_ref(cache_dir: Path, pull: Pull) -> None:
    """Record that the repository's main branch was at `pull.commit` (refs/main), as the library does."""
    ref = repo_folder(cache_dir, pull.repo_id) / "refs" / "main"
    ref.parent.mkdir(parents=True, exist_ok=True)
    ref.write_text(pull.commit, encoding="utf-8")
