"""The model picker's remote groups: each server the user added, its name over its models.

Each server's list is asked for (GET /v1/models) on a thread of its own; a server that
cannot be reached shows why, in its group. Double-click or "Use" picks a model.
"""

import contextlib
import threading

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QHBoxLayout, QLabel, QPushButton, QTreeWidget, QTreeWidgetItem, QVBoxLayout, QWidget

from engine.errors import SprigError
from engine.remote import keys
from engine.remote.client import list_models
from engine.remote.endpoints import Endpoint

MODEL = Qt.ItemDataRole.UserRole  # a model item's (Endpoint, model id)


class RemoteModels(QWidget):
    """Servers and their models. Emits `chosen(endpoint, model_id)`; `add_requested` for "Add a server…"."""

    chosen = Signal(object, str)
    add_requested = Signal()
    _listed = Signal(int, int, object)  # listing round, group index, list of model ids or an error message

    def __init__(self, endpoints: list[Endpoint], parent: QWidget | None = None):
        super().__init__(parent)
        self.tree = QTreeWidget()
        self.tree.setHeaderHidden(True)
        self.use_button = QPushButton("Use", enabled=False)
        add = QPushButton("Add a server…")
        self.tree.itemDoubleClicked.connect(lambda *_: self._use())
        self.tree.itemSelectionChanged.connect(lambda: self.use_button.setEnabled(self._selected() is not None))
        self.use_button.clicked.connect(self._use)
        add.clicked.connect(self.add_requested)
        self._listed.connect(self._fill)
        self._round = 0  # each `set_endpoints` starts a round; a slower answer from an earlier one is dropped
        buttons = QHBoxLayout()
        buttons.addWidget(QLabel("Models on servers"), 1)
        buttons.addWidget(add)
        buttons.addWidget(self.use_button)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addLayout(buttons)
        layout.addWidget(self.tree)
        self.set_endpoints(endpoints)

    def set_endpoints(self, endpoints: list[Endpoint]) -> None:
        """Show these servers, asking each for its models."""
        self.tree.clear()
        self._endpoints = list(endpoints)
        self._round += 1
        for index, endpoint in enumerate(self._endpoints):
            group = QTreeWidgetItem([f"{endpoint.name} — {endpoint.base_url}"])
            group.addChild(QTreeWidgetItem(["Asking for its models…"]))
            self.tree.addTopLevelItem(group)
            group.setExpanded(True)
            threading.Thread(target=self._list, args=(self._round, index, endpoint), daemon=True).start()

    def _list(self, round_: int, index: int, endpoint: Endpoint) -> None:
        try:
            found: list[str] | str = list_models(endpoint, keys.api_key(endpoint.base_url))
        except SprigError as exc:
            found = str(exc)
        with contextlib.suppress(RuntimeError):  # the picker was closed meanwhile
            self._listed.emit(round_, index, found)

    def _fill(self, round_: int, index: int, found: object) -> None:
        group = self.tree.topLevelItem(index)
        if group is None or round_ != self._round:
            return
        group.takeChildren()
        if isinstance(found, str):
            group.addChild(QTreeWidgetItem([found]))
            return
        assert isinstance(found, list)
        for model_id in found:
            item = QTreeWidgetItem([model_id])
            item.setData(0, MODEL, (self._endpoints[index], model_id))
            group.addChild(item)

    def _selected(self) -> tuple[Endpoint, str] | None:
        items = self.tree.selectedItems()
        return items[0].data(0, MODEL) if items else None

    def _use(self) -> None:
        selected = self._selected()
        if selected is not None:
            self.chosen.emit(*selected)
