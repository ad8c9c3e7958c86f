"""The Hugging Face Hub for the window: searches, file lists and downloads off the GUI thread.

Queries (search, a repository's files) run on one thread and a download on another, so
a search answers while a model downloads. One download runs at a time. Pause keeps the
bytes so far and the pull's record in the cache (it resumes after a restart of the app
too); Cancel removes them. A token saved in the keyring is used for every call.
"""

from collections.abc import Callable, Iterator
from typing import Any

from PySide6.QtCore import QObject, Signal

from app.settings import Settings
from app.worker import EngineThread, Job
from engine.errors import DownloadPaused
from engine.hub import tokens
from engine.hub.connection import Hub
from engine.hub.download import Progress, Pull, discard, download, pending_pulls


class HubController(QObject):
    """Runs Hub calls on threads of its own and reports back through signals."""

    answered = Signal(object, object)  # Job, result
    failed = Signal(object, object)  # Job, the exception (its message is for the user)
    progress = Signal(object)  # Progress of the running download
    download_finished = Signal(object)  # the last Progress, whose `path` is the model's file
    download_stopped = Signal(
        object, object
    )  # Pull, the exception that stopped it (None: the user paused or cancelled)

    def __init__(self, settings: Callable[[], Settings], parent: QObject | None = None):
        super().__init__(parent)
        self._settings = settings
        self._threads: dict[str, EngineThread] = {}
        self._errors: dict[int, Exception] = {}
        self.running: Pull | None = None
        self.last: Progress | None = None
        self._job: Job | None = None
        self._cancelled = False

    def hub(self, with_token: bool = False) -> Hub:
        """The Hub as the settings say now (offline or not); `with_token` reads the keyring's token too.

        Only calls to the Hub need the token: listing the cache never touches the keyring.
        """
        return Hub(token=tokens.stored_token() if with_token else None, offline=self._settings().hub_offline)

    def _thread(self, name: str) -> EngineThread:
        if name not in self._threads:
            thread = self._threads[name] = EngineThread()
            thread.worker.errored.connect(self._on_errored)
            thread.worker.finished.connect(self._on_finished)
            thread.worker.yielded.connect(self._on_yielded)
        return self._threads[name]

    def query(self, call: Callable[[Hub], Any], kind: str = "query") -> Job:
        """Run `call(hub)` on the query thread; its result comes through `answered`, an error through `failed`."""
        hub = self.hub(with_token=True)
        job = Job(lambda _cancel: None, kind)
        job.run = lambda _cancel: self._recorded(job, lambda: call(hub))
        return self._thread("query").worker.submit(job)

    def start(self, pull: Pull) -> bool:
        """Download `pull` (or resume it); False if another download is running."""
        if self.running is not None:
            return False
        hub = self.hub(with_token=True)
        self.running, self.last, self._cancelled = pull, None, False
        job = self._job = Job(lambda _cancel: None, "download")
        job.run = lambda cancel: self._recorded_steps(job, download(hub, pull, cancel))
        self._thread("download").worker.submit(job)
        return True

    def pause(self) -> None:
        """Stop the running download, keeping its bytes to resume."""
        if self._job is not None:
            self._job.cancel.set()

    def cancel(self) -> None:
        """Stop the running download and remove what it downloaded."""
        self._cancelled = True
        self.pause()

    def discard(self, pull: Pull) -> None:
        """Remove a paused download's bytes and record."""
        discard(self.hub().cache_dir, pull)

    def pending(self) -> list[Pull]:
        """Downloads paused or interrupted before, which can resume."""
        return [p for p in pending_pulls(self.hub().cache_dir) if p != self.running]

    def stop(self) -> None:
        """Pause the running download and end the threads (the window calls this when it closes)."""
        self.pause()
        for thread in self._threads.values():
            thread.stop()
        self._threads.clear()

    def _recorded(self, job: Job, call: Callable[[], Any]) -> Any:
        """`call()`, keeping its exception for `failed` (the worker passes on only the message)."""
        try:
            return call()
        except Exception as exc:
            self._errors[job.id] = exc
            raise

    def _recorded_steps(self, job: Job, steps: Iterator[Progress]) -> Iterator[Progress]:
        """The steps of a download, keeping the exception that ends them."""
        try:
            yield from steps
        except Exception as exc:
            self._errors[job.id] = exc
            raise

    def _on_errored(self, job: Job, message: str) -> None:
        error = self._errors.get(job.id) or RuntimeError(message)
        if job.kind != "download":
            self.failed.emit(job, error)
            return
        pull, self.running, self._job = self.running, None, None
        if isinstance(error, DownloadPaused):
            if self._cancelled and pull is not None:
                self.discard(pull)
            self.download_stopped.emit(pull, None)
        else:
            self.download_stopped.emit(pull, error)

    def _on_yielded(self, job: Job, items: list) -> None:
        self.last = items[-1]
        self.progress.emit(self.last)

    def _on_finished(self, job: Job, result: object) -> None:
        if self._errors.pop(job.id, None) is not None:
            return  # `failed` or `download_stopped` said why
        if job.kind != "download":
            self.answered.emit(job, result)
            return
        if self.running is not None and self.last is not None and self.last.path is not None:
            self.running, self._job = None, None
            self.download_finished.emit(self.last)
