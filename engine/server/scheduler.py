"""The engine that owns a loaded model and runs its generations, several at once, in lock-step.

The app's chat and the server's requests all become `Ticket`s. The scheduler keeps two
FIFO lanes, the app's first, and runs up to `max_batch` server tickets at once (the app's
chat is never held back by that limit). Each running ticket is a generator driven on a
thread of its own, but only one thread runs at a time: the engine thread hands each
running ticket its turn and waits for it to give the turn back, so no two threads ever
touch the model (and its backend's buffers) at once.

A turn ends when the ticket yields an event, ends, or asks for a plain decode step
(`engine.batching`). A round of the engine gives every running ticket a turn, runs the
decode steps they asked for as one batched forward pass (`run_batch`), and gives those
tickets a turn again to sample their token and yield its event. So plain decodes step in
lock-step, one token each per round; prefill stays per request (in the ticket's first
turn), a ticket that arrives joins at the next round (continuous batching), and a ticket
that decodes otherwise (speculation) takes its turns unbatched between the rounds' passes.

Each ticket brings its own KV cache (the server's come from a pool, see `completions`), so
conversations never overwrite each other's keys and values. A ticket is a function of a
cancel flag that returns an iterator of events. Each event goes to the ticket's `deliver`
callback (on the ticket's thread), then the `END` marker, or the exception that ended it.
Setting a ticket's cancel flag stops a running generation between two decode steps
(`generate` checks it), and a waiting ticket whose flag is set is dropped without ever
starting.

The server's lane is bounded: `submit` raises `QueueFull` when `max_waiting` server tickets
already wait beyond those about to fill the batch's free places. The app's lane is never refused.
"""

import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from engine.batching import StepRequest, run_batch, stepping

APP = 0  # the app's own chat: served before any waiting server request
SERVER = 1

END = object()  # delivered after a ticket's last event


class QueueFull(Exception):
    """Too many server requests are waiting already."""


class SchedulerClosed(Exception):
    """The scheduler was stopped (the model is being unloaded)."""


@dataclass
class Ticket:
    """One generation waiting for the model, or running on it."""

    run: Callable[[threading.Event], Iterator[Any]]  # called, and iterated, on the ticket's thread
    deliver: Callable[[Any], None]  # each event, then END or the exception; on the ticket's thread
    lane: int = SERVER
    cancel: threading.Event = field(default_factory=threading.Event)
    enqueued: float = field(default_factory=time.monotonic)
    started: float | None = None  # when it began to run; None while it waits or if it never ran


@dataclass
class SchedulerStats:
    """Counters the metrics endpoint and the app's panel read."""

    served: int = 0
    skipped: int = 0  # cancelled before they started
    refused: int = 0  # turned away because the queue was full
    queue_wait_seconds: float = 0.0  # summed over the tickets that started


class _Running:
    """A ticket that runs: its generator, driven on a thread of its own that runs only
    between `turn()` and the turn's end (an event yielded, a step asked for, or the end)."""

    def __init__(self, ticket: Ticket, name: str):
        self.ticket = ticket
        self.step: StepRequest | None = None  # the decode step it waits for, until the batch ran
        self.done = False
        self._go = threading.Semaphore(0)
        self._parked = threading.Semaphore(0)
        self.thread = threading.Thread(target=self._main, name=name, daemon=True)
        self.thread.start()

    def turn(self) -> None:
        """Let the ticket run until it gives the turn back (engine thread)."""
        self._go.release()
        self._parked.acquire()
        if self.done:
            self.thread.join()

    def _park(self) -> None:
        self._parked.release()
        self._go.acquire()

    def _post(self, request: StepRequest) -> Any:
        """Wait for the batch to run `request`; its logits (1, vocab), or its error raised."""
        self.step = request
        self._park()
        self.step = None
        if request.error is not None:
            raise request.error
        return request.logits

    def _main(self) -> None:
        self._go.acquire()
        ticket = self.ticket
        try:
            with stepping(self._post):
                for event in ticket.run(ticket.cancel):
                    ticket.deliver(event)
                    self._park()
        except BaseException as exc:  # handed to the waiting caller, who reports it
            ticket.deliver(exc)
        else:
            ticket.deliver(END)
        finally:
            self.done = True
            self._parked.release()


class Scheduler:
    """Runs up to `max_batch` server tickets (and the app's) at once, their plain decode
    steps batched; app lane first, FIFO within a lane."""

    def __init__(self, max_waiting: int = 16, max_batch: int = 4, name: str = "sprig-scheduler"):
        if max_batch < 1:
            raise ValueError(f"max_batch must be at least 1, not {max_batch}")
        self.max_waiting = max_waiting
        self.max_batch = max_batch
        self.stats = SchedulerStats()
        self._name = name
        self._lanes: tuple[deque[Ticket], deque[Ticket]] = (deque(), deque())
        self._cond = threading.Condition()
        self._running: list[_Running] = []
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    # -- queueing --------------------------------------------------------------------

    def submit(self, ticket: Ticket) -> Ticket:
        """Queue `ticket`; raises QueueFull (server lane only) or SchedulerClosed."""
        with self._cond:
            if self._closed:
                raise SchedulerClosed("the model is being unloaded")
            if ticket.lane == SERVER and self._waiting_server() >= self.max_waiting + self._free_slots():
                self.stats.refused += 1
                raise QueueFull(f"{self.max_waiting} requests are already waiting")
            ticket.enqueued = time.monotonic()
            self._lanes[ticket.lane].append(ticket)
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

    def _free_slots(self) -> int:
        """Server tickets that may still join the running batch."""
        return self.max_batch - sum(r.ticket.lane == SERVER for r in self._running)

    def _has_room(self, lane: int) -> bool:
        """Whether a ticket of `lane` may start now: the app's always, the server's while the
        batch has room."""
        return lane == APP or self._free_slots() > 0

    @property
    def waiting(self) -> int:
        """Tickets waiting for the model, both lanes, not counting cancelled ones."""
        with self._cond:
            return sum(1 for lane in self._lanes for t in lane if not t.cancel.is_set())

    @property
    def in_flight(self) -> int:
        """Tickets running now (decoding together)."""
        return len(self._running)

    def wake(self) -> None:
        """Let the engine thread notice cancelled waiting tickets now (they are dropped)."""
        with self._cond:
            self._cond.notify_all()

    def close(self, timeout: float = 30.0) -> None:
        """Cancel what runs and what waits, and end the thread (after the running step)."""
        with self._cond:
            self._closed = True
            for running in self._running:
                running.ticket.cancel.set()
            for lane in self._lanes:
                for ticket in lane:
                    ticket.cancel.set()
            self._cond.notify_all()
            own = {self._thread, *(r.thread for r in self._running)}
        if threading.current_thread() not in own:
            self._thread.join(timeout)

    # -- the engine thread -------------------------------------------------------------

    def _admit(self) -> bool:
        """Start the waiting tickets there is room for, dropping cancelled ones; wait while
        nothing runs. False once closed and drained."""
        with self._cond:
            while True:
                for lane_index, lane in enumerate(self._lanes):
                    for ticket in [t for t in lane if t.cancel.is_set()]:
                        lane.remove(ticket)
                        self.stats.skipped += 1
                        ticket.deliver(END)
                    while lane and self._has_room(lane_index):
                        self._start(lane.popleft())
                if self._running:
                    return True
                if self._closed:
                    return False
                self._cond.wait()

    def _start(self, ticket: Ticket) -> None:
        ticket.started = time.monotonic()
        self.stats.queue_wait_seconds += ticket.started - ticket.enqueued
        self._running.append(_Running(ticket, f"{self._name}-ticket"))

    def _round(self) -> None:
        """Every running ticket's turn, then one batched pass for the steps they asked for,
        then the turns of those tickets again (each samples its token and yields it)."""
        for running in list(self._running):
            if running.step is None:
                running.turn()
        self._reap()
        asking = [r for r in self._running if r.step is not None]
        if asking:
            run_batch([r.step for r in asking if r.step is not None])
            for running in asking:
                running.turn()
            self._reap()

    def _reap(self) -> None:
        with self._cond:
            ended = [r for r in self._running if r.done]
            for running in ended:
                self._running.remove(running)
                self.stats.served += 1

    def _loop(self) -> None:
        while self._admit():
            self._round()
