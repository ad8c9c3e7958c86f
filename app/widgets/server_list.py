"""Settings → Models: the remote servers the user added, to add, edit and remove.

The list only asks; the window does the work (the store, the keyring, the model host)
and shows the servers again with `set_endpoints`.
"""

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QHBoxLayout, QListWidget, QListWidgetItem, QPushButton, QVBoxLayout, QWidget

from engine.remote.endpoints import Endpoint

ENDPOINT = Qt.ItemDataRole.UserRole  # an item's Endpoint


class ServerList(QWidget):
    """The servers, one a line (name — base URL), with Add a server…, Edit… and Remove."""

    add_requested = Signal()
    edit_requested = Signal(object)  # Endpoint
    remove_requested = Signal(object)  # Endpoint

    def __init__(self, endpoints: list[Endpoint], parent: QWidget | None = None):
        super().__init__(parent)
        self.list = QListWidget()
        self.list.setObjectName("ServerList")
        self.list.setAccessibleName("Servers")
        self.add_button = QPushButton("Add a server…", autoDefault=False)
        self.add_button.setToolTip("Chat with the models of an OpenAI-compatible server (llama.cpp, vLLM, Ollama, …)")
        self.edit_button = QPushButton("Edit…", autoDefault=False, enabled=False)
        self.remove_button = QPushButton("Remove", autoDefault=False, enabled=False)
        self.remove_button.setToolTip("Forget the server and delete its key from the keyring; its chats stay")
        self.add_button.clicked.connect(self.add_requested)
        self.edit_button.clicked.connect(lambda: self._ask(self.edit_requested))
        self.remove_button.clicked.connect(lambda: self._ask(self.remove_requested))
        self.list.itemDoubleClicked.connect(lambda _item: self._ask(self.edit_requested))
        self.list.itemSelectionChanged.connect(self._enable)
        buttons = QHBoxLayout()
        buttons.addWidget(self.add_button)
        buttons.addStretch(1)
        buttons.addWidget(self.edit_button)
        buttons.addWidget(self.remove_button)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.list)
        layout.addLayout(buttons)
        self.set_endpoints(endpoints)

    def set_endpoints(self, endpoints: list[Endpoint]) -> None:
        """Show these servers."""
        self.list.clear()
        for endpoint in endpoints:
            item = QListWidgetItem(f"{endpoint.name} — {endpoint.base_url}")
            item.setData(ENDPOINT, endpoint)
            self.list.addItem(item)
        self.list.setVisible(bool(endpoints))
        self._enable()

    def select(self, name: str) -> None:
        """Select the server called `name`."""
        for row in range(self.list.count()):
            item = self.list.item(row)
            item.setSelected(item.data(ENDPOINT).name == name)

    def _selected(self) -> Endpoint | None:
        items = self.list.selectedItems()
        return items[0].data(ENDPOINT) if items else None

    def _enable(self) -> None:
        chosen = self._selected() is not None
        self.edit_button.setEnabled(chosen)
        self.remove_button.setEnabled(chosen)

    def _ask(self, signal) -> None:
        endpoint = self._selected()
        if endpoint is not None:
            signal.emit(endpoint)
