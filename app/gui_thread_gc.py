"""Garbage collection on the GUI thread only.

Python's cyclic garbage collector runs on whichever thread happens to allocate when a
generation fills up. In Sprig that is often the engine or a scheduler thread, which
allocate all the time while a model answers. When the garbage includes a Qt object that
Python owns (a closed dialog, a window, a text document caught in a reference cycle with
its slots), its C++ destructor then runs on that thread, beside the GUI thread's event
loop: Qt objects must be destroyed on the thread they live on, and the event loop can
crash on one half torn down. The usual remedy in Qt applications written in Python
(pyqtgraph's GarbageCollector does the same) is to switch automatic collection off and
collect from a timer on the GUI thread; reference counting still frees everything that is
not in a cycle at once, on whatever thread drops it.
"""

import gc

from PySide6.QtCore import QObject, QTimer

INTERVAL_MS = 500


class GuiThreadCollector(QObject):
    """While it runs, cyclic garbage is collected only here, on the GUI thread, with the
    collector's own thresholds."""

    def __init__(self, parent: QObject | None = None):
        super().__init__(parent)
        self.thresholds = gc.get_threshold()
        self._timer = QTimer(self, interval=INTERVAL_MS)
        self._timer.timeout.connect(self.collect_due)
        gc.disable()
        self._timer.start()

    def collect_due(self) -> None:
        """Collect each generation whose count passed its threshold, as Python would."""
        counts = gc.get_count()
        for generation in range(2, -1, -1):  # the oldest due generation, which includes the younger ones
            if counts[generation] > self.thresholds[generation]:
                gc.collect(generation)
                return

    def stop(self) -> None:
        """Collect what is left here, on the GUI thread, and give collection back to Python."""
        self._timer.stop()
        gc.collect()
        gc.enable()
