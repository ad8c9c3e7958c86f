"""The local server's settings: port, API key, CORS origins, and whether other computers may use it.

The key goes to the keyring, never to the settings (the window keeps it). Reachable from
this network needs a key: while none is typed, the box says so and OK is refused.
"""

from dataclasses import replace

from PySide6.QtWidgets import QCheckBox, QDialog, QDialogButtonBox, QFormLayout, QLabel, QLineEdit, QWidget

from app.local_server import NETWORK_NEEDS_KEY
from app.settings import Settings
from app.widgets.settings_dialog import int_box


class ServerSettingsDialog(QDialog):
    """Edits `settings`' server fields and the key; after `exec()`, read `settings()` and `key()`."""

    def __init__(self, settings: Settings, key: str | None, parent: QWidget | None = None):
        super().__init__(parent)
        self.setWindowTitle("Local server settings")
        self._settings = settings
        self.port = int_box("server_port", 1)
        self.port.setValue(settings.server_port)
        self.api_key = QLineEdit(key or "", echoMode=QLineEdit.EchoMode.Password)
        self.api_key.setAccessibleName("API key")
        self.api_key.setPlaceholderText("None: any program on this computer may use the server")
        self.api_key.setToolTip("Clients send it as 'Authorization: Bearer <key>'. Kept in the system keyring.")
        self.origins = QLineEdit(settings.server_origins)
        self.origins.setPlaceholderText("e.g. http://localhost:3000 (web pages allowed to call the server)")
        self.network = QCheckBox("Reachable from this network (listens on every interface)")
        self.network.setChecked(settings.server_network)
        self.refusal = QLabel(NETWORK_NEEDS_KEY, objectName="ErrorLabel", wordWrap=True)
        self.buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
        self.buttons.accepted.connect(self.accept)
        self.buttons.rejected.connect(self.reject)
        form = QFormLayout(self)
        form.addRow("Port", self.port)
        form.addRow("API key", self.api_key)
        form.addRow("CORS origins", self.origins)
        form.addRow(self.network)
        form.addRow(self.refusal)
        form.addRow(self.buttons)
        self.network.toggled.connect(self._check)
        self.api_key.textChanged.connect(self._check)
        self._check()
        self.resize(520, 0)

    def _check(self) -> None:
        refused = self.network.isChecked() and not self.key()
        self.refusal.setVisible(refused)
        self.buttons.button(QDialogButtonBox.StandardButton.Ok).setEnabled(not refused)
        self.adjustSize()  # room for the refusal's lines, or none

    def key(self) -> str | None:
        """The key typed (None when empty)."""
        return self.api_key.text().strip() or None

    def settings(self) -> Settings:
        """The settings with the server fields as edited."""
        return replace(
            self._settings,
            server_port=self.port.value(),
            server_origins=self.origins.text().strip(),
            server_network=self.network.isChecked(),
        )
