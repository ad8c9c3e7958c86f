"""The engine thread: every slow call (loading, generating, reading headers) runs here.

Modelled on superqt's generator workers. A `Job` wraps a function of a cancel flag; if
the function returns a generator, its items are streamed back. The worker lives on one
QThread and emits typed signals (`started`, `yielded`, `errored`, `finished`) that Qt
queues to the GUI thread, where slots touch widgets. Items are batched so the GUI
repaints at most about 30 times a second however fast the engine goes.

`JobRunner` is the engine thread as its users see it: one job at a time, each started
with its own handlers, which are called on the GUI thread. The model host (loads, unloads)
and the chat controller (answers) share one, so their work never overlaps.
"""

import threading
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from itertools import count
from typing import Any, NamedTuple

from PySide6.QtCore import QObject, QThread, Signal, Slot

from engine.errors import SprigError

EMIT_INTERVAL = 1 / 30  # seconds between batches of yielded items


@dataclass
class Job:
    """One piece of engine work. `run(cancel)` returns a result or a generator of items."""

    run: Callable[[threading.Event], Any]
    kind: str = ""
    cancel: threading.Event = field(default_factory=threading.Event)
    id: int = field(default_factory=count(1).__next__)


def error_message(exc: BaseException) -> str:
    """What the user reads for an exception: the engine's own message, intact."""
    if isinstance(exc, SprigError):
        return str(exc)
    if isinstance(exc, MemoryError):
        return "Out of memory. Close other programs, or use a smaller model or a shorter context."
    return f"{type(exc).__name__}: {exc}"


class Worker(QObject):
    """Runs jobs one at a time on the engine thread."""

    started = Signal(object)  # Job
    yielded = Signal(object, object)  # Job, list of the items since the last batch
    errored = Signal(object, str)  # Job, message for the user
    finished = Signal(object, object)  # Job, result (None for generators); always emitted

    _submit = Signal(object)

    def __init__(self) -> None:
        super().__init__()
        self._submit.connect(self._run)

    def submit(self, job: Job) -> Job:
        """Queue `job` on the engine thread (callable from the GUI thread)."""
        self._submit.emit(job)
        return job

    @Slot(object)
    def _run(self, job: Job) -> None:
        self.started.emit(job)
        result = None
        try:
            result = job.run(job.cancel)
            if isinstance(result, Iterator):
                self._stream(job, result)
                result = None
        except Exception as exc:  # the GUI must always hear back, whatever went wrong
            if not isinstance(exc, SprigError):  # an engine error is expected; anything else is a bug
                traceback.print_exc()
            self.errored.emit(job, error_message(exc))
        finally:
            self.finished.emit(job, result)

    def _stream(self, job: Job, items: Iterator) -> None:
        batch: list = []
        last_emit = 0.0
        try:
            for item in items:
                batch.append(item)
                now = time.monotonic()
                if now - last_emit >= EMIT_INTERVAL:
                    self.yielded.emit(job, batch)
                    batch, last_emit = [], now
        finally:  # what came before a failure is part of the answer, kept
            if batch:
                self.yielded.emit(job, batch)


class EngineThread:
    """A QThread with one Worker on it; `stop()` waits for the current job to end."""

    def __init__(self) -> None:
        self.thread = QThread()
        self.thread.setObjectName("sprig-engine")
        self.worker = Worker()
        self.worker.moveToThread(self.thread)
        self.thread.start()

    def stop(self, current: Job | None = None) -> None:
        """Cancel `current` (if any), then end the thread."""
        if current is not None:
            current.cancel.set()
        self.thread.quit()
        self.thread.wait()


class Handlers(NamedTuple):
    """What to call, on the GUI thread, when a job yields items, fails, and ends (always)."""

    finished: Callable[[Any], None]
    errored: Callable[[str], None]
    yielded: Callable[[list], None] | None = None


class JobRunner(QObject):
    """The engine thread's jobs, one at a time. `busy_changed` says when it takes one and when it is free;
    `idle` follows the second, for work that waited for it."""

    busy_changed = Signal(bool)
    idle = Signal()

    def __init__(self, parent: QObject | None = None):
        super().__init__(parent)
        self.engine = EngineThread()
        self.job: Job | None = None
        self._handlers: Handlers | None = None
        self.engine.worker.yielded.connect(self._on_yielded)
        self.engine.worker.errored.connect(self._on_errored)
        self.engine.worker.finished.connect(self._on_finished)

    @property
    def busy(self) -> bool:
        """True while a job runs (or waits to) on the engine thread."""
        return self.job is not None

    def kind(self) -> str | None:
        """The running job's kind, or None."""
        return self.job.kind if self.job is not None else None

    def start(self, job: Job, handlers: Handlers) -> None:
        """Run `job` on the engine thread; `handlers` hear from it on the GUI thread."""
        self.job, self._handlers = job, handlers
        self.busy_changed.emit(True)
        self.engine.worker.submit(job)

    def cancel(self) -> None:
        """Cancel the running job; it stops within one step."""
        if self.job is not None:
            self.job.cancel.set()

    def stop(self) -> None:
        """Cancel the running job and end the engine thread (when the app closes)."""
        self.engine.stop(self.job)

    def _on_yielded(self, job: Job, items: list) -> None:
        if job is self.job and self._handlers is not None and self._handlers.yielded is not None:
            self._handlers.yielded(items)

    def _on_errored(self, job: Job, message: str) -> None:
        if job is self.job and self._handlers is not None:
            self._handlers.errored(message)

    def _on_finished(self, job: Job, result: object) -> None:
        if job is not self.job or self._handlers is None:
            return
        handlers, self.job, self._handlers = self._handlers, None, None
        handlers.finished(result)
        if self.job is None:  # a handler may have started the next job
            self.busy_changed.emit(False)
            self.idle.emit()
