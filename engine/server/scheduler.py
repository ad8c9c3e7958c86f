"""The one engine thread that owns a loaded model and runs every generation on it, in turn.

The app's chat and the server's requests all become `Ticket`s. The scheduler keeps two
FIFO lanes, the app's first, and runs one ticket at a time on its own thread, so no two
generations ever touch the model (and its backend's buffers) at once. Each ticket brings
its own KV cache, or uses the scheduler's server cache, so conversations never overwrite
each other's keys and values.

A ticket is a function of a cancel flag that returns an iterator of events. The scheduler
hands each event to the ticket's `deliver` callback (on the engine thread), then the
`END` marker, or the exception that ended it. Setting a ticket's cancel flag stops a
running generation between two decode steps (`generate` checks it), and a waiting ticket
whose flag is set is dropped without ever starting.

The server's lane is bounded: `submit` raises `QueueFull` when `max_waiting` server tickets
already wait. The app's lane is never refused.
"""

import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

APP = 0  # the app's own chat: served before any waiting server request
SERVER = 1

END = object()  # delivered after a ticket's last event


class QueueFull(Exception):
    """Too many server requests are waiting already."""


class SchedulerClosed(Exception):
    """The scheduler was stopped (the model is being unloaded)."""


@dataclass
class Ticket:
    """One generation waiting for, or holding, the model."""

    run: Callable[[threading.Event], Iterator[Any]]  # called on the engine thread
    deliver: Callable[[Any], None]  # each event, then END or the exception; on the engine thread
    lane: int = SERVER
    cancel: threading.Event = field(default_factory=threading.Event)
    enqueued: float = field(default_factory=time.monotonic)
    started: float | None = None  # when it got the model; None while it waits or if it never ran


@dataclass
class SchedulerStats:
    """Counters the metrics endpoint and the app's panel read."""

    served: int = 0
    skipped: int = 0  # cancelled before they started
    refused: int = 0  # turned away because the queue was full
    queue_wait_seconds: float = 0.0  # summed over the tickets that started


class Scheduler:
    """Runs tickets one at a time on a daemon thread, app lane first, FIFO within a lane."""

    def __init__(self, max_waiting: int = 16, name: str = "sprig-scheduler"):
        self.max_waiting = max_waiting
        self.stats = SchedulerStats()
        self._lanes: tuple[deque[Ticket], deque[Ticket]] = (deque(), deque())
        self._cond = threading.Condition()
        self._running: Ticket | None = None
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    # -- queueing --------------------------------------------------------------------

    def submit(self, ticket: Ticket) -> Ticket:
        """Queue `ticket`; raises QueueFull (server lane only) or SchedulerClosed."""
        with self._cond:
            if self._closed:
                raise SchedulerClosed("the model is being unloaded")
            lane = self._lanes[ticket.lane]
            idle = self._running is None and not any(self._lanes)  # it starts at once: it will not wait
            if ticket.lane == SERVER and not idle and self._waiting_server() >= self.max_waiting:
                self.stats.refused += 1
                raise QueueFull(f"{self.max_waiting} requests are already waiting")
            ticket.enqueued = time.monotonic()
            lane.append(ticket)
            self._cond.notify_all()
        return ticket

    def stream(
        self, run: Callable[[threading.Event], Iterator[Any]], cancel: threading.Event, lane: int = APP
    ) -> Iterator[Any]:
        """Run `run` as a ticket and yield its events on the calling thread (blocking).

        For callers on a thread of their own (the app's worker). An exception raised by
        `run` is raised here. Leaving the loop early cancels the ticket. A ticket cancelled
        while it waits yields nothing.
        """
        events: queue.SimpleQueue = queue.SimpleQueue()
        self.submit(Ticket(run, events.put, lane, cancel))
        ended = False
        try:
            while True:
                item = events.get()
                ended = item is END or isinstance(item, BaseException)
                if item is END:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            if not ended:  # the caller stopped reading: stop the ticket too
                cancel.set()

    def _waiting_server(self) -> int:
        return sum(1 for t in self._lanes[SERVER] if not t.cancel.is_set())

    @property
    def waiting(self) -> int:
        """Tickets waiting for the model, both lanes, not counting cancelled ones."""
        with self._cond:
            return sum(1 for lane in self._lanes for t in lane if not t.cancel.is_set())

    @property
    def in_flight(self) -> int:
        """1 while a ticket holds the model, else 0."""
        return 0 if self._running is None else 1

    def wake(self) -> None:
        """Let the engine thread notice cancelled waiting tickets now (they are dropped)."""
        with self._cond:
            self._cond.notify_all()

    def close(self, timeout: float = 30.0) -> None:
        """Cancel what runs and what waits, and end the thread (after the running step)."""
        with self._cond:
            self._closed = True
            if self._running is not None:
                self._running.cancel.set()
            for lane in self._lanes:
                for ticket in lane:
                    ticket.cancel.set()
            self._cond.notify_all()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    # -- the engine thread -------------------------------------------------------------

    def _next(self) -> Ticket | None:
        """The next ticket to run, dropping cancelled ones; None once closed and drained."""
        with self._cond:
            while True:
                for lane in self._lanes:
                    while lane:
                        ticket = lane.popleft()
                        if not ticket.cancel.is_set():
                            self._running = ticket
                            return ticket
                        self.stats.skipped += 1
                        ticket.deliver(END)
                if self._closed:
                    return None
                self._cond.wait()

    def _loop(self) -> None:
        while (ticket := self._next()) is not None:
            ticket.started = time.monotonic()
            self.stats.queue_wait_seconds += ticket.started - ticket.enqueued
            try:
                for event in ticket.run(ticket.cancel):
                    ticket.deliver(event)
            except BaseException as exc:  # handed to the waiting caller, who reports it
                ticket.deliver(exc)
            else:
                ticket.deliver(END)
            finally:
                with self._cond:
                    self._running = None
                    self.stats.served += 1
