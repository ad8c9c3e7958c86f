"""The "Local server" row: the switch, the address, a copyable curl example, the traffic, and its settings."""

from PySide6.QtCore import QTimer, Signal
from PySide6.QtWidgets import (
    QApplication,
    QCheckBox,
    QFrame,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QVBoxLayout,
)

COPIED_MS = 1500


class ServerPanel(QFrame):
    """Shows the local server's state; `toggled(bool)` asks for it on or off.

    The window feeds it: `set_running(on, address, curl, copied)` and `set_counts(requests, waiting)`.
    `curl` is shown (its key masked); Copy puts `copied`, the whole command, on the clipboard.
    """

    toggled = Signal(bool)
    settings_requested = Signal()

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setObjectName("ServerPanel")
        self.switch = QCheckBox("Local server")
        self.address = QLabel()
        self.address.setTextInteractionFlags(self.address.textInteractionFlags().TextSelectableByMouse)
        self.counts = QLabel()
        self.curl = QLineEdit(readOnly=True)
        self.copy_button = QPushButton("Copy")
        self.copy_button.setToolTip("Copy the curl example (with the API key, if one is set)")
        self.settings_button = QPushButton("Settings…")
        self.settings_button.setToolTip("Port, API key, CORS origins, reachable from this network")
        self._copied = ""

        top = QHBoxLayout()
        top.addWidget(self.switch)
        top.addWidget(self.address, 1)
        top.addWidget(self.counts)
        top.addWidget(self.settings_button)
        example = QHBoxLayout()
        example.addWidget(self.curl, 1)
        example.addWidget(self.copy_button)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(8, 4, 8, 4)
        layout.addLayout(top)
        layout.addLayout(example)

        self.switch.toggled.connect(self.toggled)
        self.copy_button.clicked.connect(self.copy_example)
        self.settings_button.clicked.connect(self.settings_requested)
        self.set_running(False, "", "", "")

    def set_running(self, on: bool, address: str, curl: str, copied: str) -> None:
        """Show the server as on (with its address and example) or off."""
        self.switch.blockSignals(True)
        self.switch.setChecked(on)
        self.switch.blockSignals(False)
        self.address.setText(address if on else "off: other programs cannot use the model")
        self.curl.setText(curl)
        self.curl.setCursorPosition(0)  # the command's start: curl and the address
        self._copied = copied
        for widget in (self.curl, self.copy_button, self.counts):
            widget.setVisible(on)

    def set_counts(self, requests: int, waiting: int) -> None:
        """Requests received since the server started, and those waiting for the model."""
        self.counts.setText(f"{requests} request{'s' * (requests != 1)} · {waiting} waiting")

    def copy_example(self) -> None:
        """Put the curl example on the clipboard."""
        QApplication.clipboard().setText(self._copied)
        self.copy_button.setText("Copied")
        QTimer.singleShot(COPIED_MS, self, lambda: self.copy_button.setText("Copy"))
