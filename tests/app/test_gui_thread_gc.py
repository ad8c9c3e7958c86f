"""Cyclic garbage made while a model answers is collected on the GUI thread, never on the
engine's threads (where destroying a Qt object can crash the event loop)."""

import gc
import threading

from app.gui_thread_gc import GuiThreadCollector


class Cycle:
    """A reference cycle that records the thread it was finalized on."""

    finalized_on: list[str] = []

    def __init__(self):
        self.me = self

    def __del__(self):
        Cycle.finalized_on.append(threading.current_thread().name)


def make_garbage_on_a_worker() -> None:
    def work():
        for _ in range(2000):
            Cycle()  # unreachable at once: only a cyclic collection frees it
        junk = [[] for _ in range(50_000)]  # allocations that would trigger a collection here
        del junk

    worker = threading.Thread(target=work, name="engine-like")
    worker.start()
    worker.join()


def test_cycles_made_on_a_worker_thread_are_collected_on_the_gui_thread(qtbot):
    Cycle.finalized_on.clear()
    collector = GuiThreadCollector()
    try:
        assert not gc.isenabled()
        make_garbage_on_a_worker()
        assert Cycle.finalized_on == []  # nothing was collected on the worker
        qtbot.waitUntil(lambda: len(Cycle.finalized_on) == 2000, timeout=5000)
        assert set(Cycle.finalized_on) == {threading.main_thread().name}
    finally:
        collector.stop()
    assert gc.isenabled()


def test_without_it_the_worker_collects_them():
    """The hazard the collector removes: Python collects on whichever thread allocates."""
    Cycle.finalized_on.clear()
    was_enabled = gc.isenabled()
    gc.enable()  # as in a process without the collector (a window left open elsewhere would have it off)
    try:
        make_garbage_on_a_worker()
        gc.collect()
    finally:
        if not was_enabled:
            gc.disable()
    assert "engine-like" in Cycle.finalized_on
