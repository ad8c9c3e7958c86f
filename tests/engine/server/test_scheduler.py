"""The scheduler on its own, one ticket at a time: the app's lane first, FIFO, cancellation, bounds."""

import threading

import pytest

from engine.server.scheduler import (
    APP,
    END,
    SERVER,
    QueueFull,
    Scheduler,
    SchedulerClosed,
    Ticket,
)


def recorder(log, name, gate=None, steps=1):
    def run(cancel):
        log.append(f"start {name}")
        for step in range(steps):
            if gate is not None:
                gate.wait(5)
            if cancel.is_set():
                log.append(f"cancelled {name}")
                return
            yield (name, step)
        log.append(f"end {name}")
    return run


def collect(items):
    done = threading.Event()

    def deliver(item):
        items.append(item)
        if item is END or isinstance(item, BaseException):
            done.set()
    return deliver, done


def hold(scheduler, log, gate, steps=1, deliver=lambda item: None):
    """Submit a ticket that holds the model until `gate` is set; return once it runs."""
    ticket = scheduler.submit(Ticket(recorder(log, "blocker", gate, steps), deliver, SERVER))
    while ticket.started is None:
        threading.Event().wait(0.005)
    return ticket


@pytest.fixture
def scheduler():
    s = Scheduler(max_waiting=2, max_batch=1)  # one ticket at a time (batches: test_batching.py)
    yield s
    s.close()


def test_app_lane_goes_first_then_fifo(scheduler):
    log, gate = [], threading.Event()
    first_items = []
    deliver, first_done = collect(first_items)
    hold(scheduler, log, gate, deliver=deliver)
    dones = []
    for name, lane in [("s1", SERVER), ("s2", SERVER), ("app", APP)]:
        deliver, done = collect([])
        dones.append(done)
        scheduler.submit(Ticket(recorder(log, name), deliver, lane))
    gate.set()
    assert first_done.wait(5) and all(d.wait(5) for d in dones)
    starts = [line for line in log if line.startswith("start")]
    assert starts == ["start blocker", "start app", "start s1", "start s2"]
    assert first_items == [("blocker", 0), END]


def test_a_cancelled_waiting_ticket_never_starts(scheduler):
    log, gate = [], threading.Event()
    deliver, blocker_done = collect([])
    hold(scheduler, log, gate, deliver=deliver)
    items = []
    deliver, done = collect(items)
    gone = Ticket(recorder(log, "gone"), deliver, SERVER)
    scheduler.submit(gone)
    gone.cancel.set()
    gate.set()
    assert blocker_done.wait(5) and done.wait(5)
    assert "start gone" not in log and items == [END] and gone.started is None
    assert scheduler.stats.skipped == 1


def test_cancel_stops_a_running_ticket_between_steps(scheduler):
    def slow(cancel):
        for step in range(100):
            if cancel.is_set():
                return
            threading.Event().wait(0.01)
            yield step
    items = []
    deliver, done = collect(items)
    ticket = scheduler.submit(Ticket(slow, deliver, SERVER))
    while not items:
        done.wait(0.005)
    ticket.cancel.set()
    assert done.wait(5)
    assert items[-1] is END and len(items) < 10


def test_server_lane_is_bounded_but_the_app_is_not(scheduler):
    gate = threading.Event()
    hold(scheduler, [], gate)
    scheduler.submit(Ticket(recorder([], "w1"), lambda item: None, SERVER))
    scheduler.submit(Ticket(recorder([], "w2"), lambda item: None, SERVER))
    with pytest.raises(QueueFull):
        scheduler.submit(Ticket(recorder([], "w3"), lambda item: None, SERVER))
    scheduler.submit(Ticket(recorder([], "app"), lambda item: None, APP))
    assert scheduler.stats.refused == 1
    gate.set()


def test_stream_raises_the_ticket_error_on_the_caller(scheduler):
    def failing(cancel):
        yield 1
        raise RuntimeError("boom")
    items = scheduler.stream(failing, threading.Event())
    assert next(items) == 1
    with pytest.raises(RuntimeError, match="boom"):
        next(items)


def test_close_cancels_and_refuses(scheduler):
    gate = threading.Event()
    log = []
    deliver, done = collect([])
    hold(scheduler, log, gate, steps=50, deliver=deliver)
    threading.Timer(0.05, gate.set).start()
    scheduler.close()
    assert done.wait(5) and "end blocker" not in log
    with pytest.raises(SchedulerClosed):
        scheduler.submit(Ticket(recorder([], "late"), lambda item: None, SERVER))
