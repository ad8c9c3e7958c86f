"""Reading model headers for the picker, on a thread of its own that the controller owns.

A large vocabulary takes seconds to read, so the picker asks for its rows here and fills
them in as they come. What was read is kept (`InfoCache`) until the file changes. The
thread is not the engine's: the picker fills in while an answer is being written.
"""

import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path

from PySide6.QtCore import QObject, Signal

from app.model_library import LibraryEntry
from app.worker import EngineThread, Job, error_message
from engine.model_info import ModelInfo, read_model_info

MISSING_FILE = "File not found: it was moved or deleted. Remove it, or add it again from its new place."


class InfoCache:
    """Model headers already read, keyed by path, size and modification time."""

    def __init__(self) -> None:
        self._infos: dict[tuple, ModelInfo | str] = {}

    @staticmethod
    def key(path: Path) -> tuple:
        """A key that changes when the file does."""
        stat = path.stat()
        return str(path), stat.st_size, stat.st_mtime_ns

    def get(self, path: Path) -> ModelInfo | str | None:
        """The info (or the error message) for `path`, if read before."""
        try:
            return self._infos.get(self.key(path))
        except OSError:
            return None

    def put(self, path: Path, value: ModelInfo | str) -> None:
        """Remember what reading `path` gave."""
        with contextlib.suppress(OSError):  # the file went away: nothing to remember
            self._infos[self.key(path)] = value


def read_entries(
    entries: list[LibraryEntry], cache: InfoCache, cancel: threading.Event
) -> Iterator[tuple[int, ModelInfo | str]]:
    """Yield (row, ModelInfo or error text) for each entry, reading headers not cached."""
    for row, entry in enumerate(entries):
        if cancel.is_set():
            return
        if not entry.path.exists():
            yield row, MISSING_FILE
            continue
        value = cache.get(entry.path)
        if value is None:
            try:
                value = read_model_info(entry.path, entry.name)
            except Exception as exc:
                value = error_message(exc)
            cache.put(entry.path, value)
        yield row, value


class HeaderReader(QObject):
    """Reads the headers of library entries on its own thread, started on first use.

    `read(entries)` returns the job; its rows arrive, in batches, through `rows_read`.
    """

    rows_read = Signal(object, object)  # Job, list of (row, ModelInfo or error text)

    def __init__(self, parent: QObject | None = None):
        super().__init__(parent)
        self.cache = InfoCache()
        self._thread: EngineThread | None = None

    def read(self, entries: list[LibraryEntry]) -> Job:
        """Start reading the headers of `entries` (a copy is taken)."""
        if self._thread is None:
            self._thread = EngineThread()
            self._thread.worker.yielded.connect(self.rows_read)
        entries = list(entries)
        return self._thread.worker.submit(Job(lambda cancel: read_entries(entries, self.cache, cancel), "headers"))

    def stop(self) -> None:
        """End the thread, cancelling what it reads (the controller calls this at shutdown)."""
        if self._thread is not None:
            self._thread.stop()
            self._thread = None
