"""Settings → Models → "Add a server" (and "Edit…"): a remote OpenAI-compatible server's address, key and name.

Presets fill in the usual base URL of each kind of server, to edit. "Test" asks the
server for its models (GET /v1/models) on a thread of its own and says what it found or
exactly what went wrong. The key goes to the keyring when the dialog is accepted (by the
window), never to the database. Editing a server starts from what it was, its key
included (read from the keyring, shown as dots).
"""

import threading

from PySide6.QtCore import Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QFormLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QWidget,
)

from engine.errors import SprigError
from engine.remote.client import list_models
from engine.remote.endpoints import PRESETS, Endpoint, normalize_base_url


class AddServerDialog(QDialog):
    """The form; given a server (`editing`) and its key, it edits that one. After `exec()`, `endpoint()`
    and `api_key()` are what the user entered."""

    tested = Signal(str)  # the Test button's verdict, from its thread

    def __init__(self, parent: QWidget | None = None, editing: Endpoint | None = None, key: str | None = None):
        super().__init__(parent)
        self.setWindowTitle("Add a server" if editing is None else f"Edit “{editing.name}”")
        self.preset = QComboBox()
        for preset in PRESETS:
            self.preset.addItem(preset.name, preset)
        self.name = QLineEdit(placeholderText="A name for the model picker, e.g. GPU box")
        self.base_url = QLineEdit(placeholderText="http://host:port/v1")
        self.key = QLineEdit(
            placeholderText="Optional; kept in the system keyring", echoMode=QLineEdit.EchoMode.Password
        )
        self.self_signed = QCheckBox("Accept a self-signed certificate (this server only)")
        self.test_button = QPushButton("Test", autoDefault=False)
        self.verdict = QLabel(wordWrap=True, objectName="ServerTestVerdict")
        self.preset.currentIndexChanged.connect(self._use_preset)
        self.test_button.clicked.connect(self.test)
        self.tested.connect(self._show_verdict)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
        buttons.accepted.connect(self._accept)
        buttons.rejected.connect(self.reject)
        form = QFormLayout(self)
        form.addRow("Kind", self.preset)
        form.addRow("Base URL", self.base_url)
        form.addRow("API key", self.key)
        form.addRow("Name", self.name)
        form.addRow(self.self_signed)
        form.addRow(self.test_button, self.verdict)
        form.addRow(buttons)
        if editing is None:
            self._use_preset()
        else:
            self._show(editing, key)

    def endpoint(self) -> Endpoint:
        """The server as entered; RemoteError for an address that cannot be one."""
        preset = self.preset.currentData()
        base_url = normalize_base_url(self.base_url.text())
        name = self.name.text().strip() or preset.name
        return Endpoint(name, base_url, not self.self_signed.isChecked(), preset.extended_sampling)

    def api_key(self) -> str | None:
        """The key entered, or None."""
        return self.key.text().strip() or None

    def test(self) -> None:
        """Ask the server for its models, on a thread; the verdict shows under the form."""
        try:
            endpoint = self.endpoint()
        except SprigError as exc:
            self._show_verdict(str(exc))
            return
        self.test_button.setEnabled(False)
        self.verdict.setText(f"Asking {endpoint.base_url}/models…")
        key = self.api_key()

        def run() -> None:
            try:
                models = list_models(endpoint, key)
            except SprigError as exc:
                self.tested.emit(str(exc))
                return
            found = ", ".join(models[:5]) + (f" and {len(models) - 5} more" if len(models) > 5 else "")
            self.tested.emit(f"Found {len(models)} model{'s' * (len(models) != 1)}: {found}." if models else
                             "The server answered, but offers no models.")  # fmt: skip

        threading.Thread(target=run, daemon=True, name="sprig-server-test").start()

    def _show_verdict(self, text: str) -> None:
        self.verdict.setText(text)
        self.test_button.setEnabled(True)

    def _show(self, endpoint: Endpoint, key: str | None) -> None:
        """Fill the form with `endpoint`: the kind whose address it has, else the first that samples as it does."""
        kinds = [p for p in PRESETS if p.base_url == endpoint.base_url] + [
            p for p in PRESETS if p.extended_sampling == endpoint.extended_sampling
        ]
        self.preset.blockSignals(True)  # the kind's usual address must not replace the server's
        self.preset.setCurrentIndex(PRESETS.index(kinds[0]))
        self.preset.blockSignals(False)
        self.name.setPlaceholderText(kinds[0].name)
        self.base_url.setText(endpoint.base_url)
        self.name.setText(endpoint.name)
        self.key.setText(key or "")
        self.self_signed.setChecked(not endpoint.verify_tls)

    def _use_preset(self) -> None:
        preset = self.preset.currentData()
        self.base_url.setText(preset.base_url)
        self.name.setPlaceholderText(preset.name)

    def _accept(self) -> None:
        try:
            self.endpoint()
        except SprigError as exc:
            self._show_verdict(str(exc))
            return
        self.accept()
