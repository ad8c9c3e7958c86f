"""The window's top bar: the current model, its backend, load progress and the buttons beside them."""

from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFrame, QHBoxLayout, QProgressBar, QPushButton, QToolButton, QWidget

from app.backend_status import BackendStatus
from app.widgets.elided_label import ElidedButton, ElidedLabel
from engine.model_info import ModelInfo, describe_parameters, format_bytes

MODEL_BUTTON_WIDTH = 300  # the most the model's name may take in the top bar, in pixels


class ModelBar(QFrame):
    """The top bar: the current model (click to pick another), backend, load progress.

    Long names are cut short with "…" (the tooltip has them whole), so a model's name never
    widens the window.
    """

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("ModelBar")
        self.model_button = ElidedButton("  ▾")
        self.model_button.setObjectName("ModelButton")
        self.model_button.setMaximumWidth(MODEL_BUTTON_WIDTH)
        self.model_button.setAccessibleName("Choose model")
        self.details = ElidedLabel()
        self.details.setObjectName("MutedLabel")
        self.progress = QProgressBar()
        self.progress.setRange(0, 1000)
        self.progress.setMinimumWidth(100)
        self.progress.setMaximumWidth(260)
        self.progress.setTextVisible(True)
        self.progress.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.progress.setAccessibleName("Loading progress")
        self.cancel_button = QPushButton("Cancel")
        self.unload_button = QPushButton("Unload")
        self.unload_button.setToolTip("Release the model's memory")
        self.backend_label = ElidedLabel()
        self.backend_label.setObjectName("BackendLabel")
        self.settings_button = QPushButton("Settings")
        self.download_button = QToolButton()  # a download under way, while the user chats
        self.download_button.setObjectName("DownloadIndicator")
        self.download_button.setAccessibleName("Download in progress")
        self.download_button.hide()
        self.metrics_button = QToolButton()
        self.metrics_button.setText("Metrics")
        self.metrics_button.setCheckable(True)
        self.metrics_button.setChecked(True)

        layout = QHBoxLayout(self)
        layout.setContentsMargins(12, 8, 12, 8)
        layout.addWidget(self.model_button)
        layout.addWidget(self.details, 1)
        layout.addWidget(self.progress, 1)
        layout.addWidget(self.cancel_button)
        layout.addWidget(self.backend_label)
        layout.addWidget(self.download_button)
        layout.addWidget(self.unload_button)
        layout.addWidget(self.settings_button)
        layout.addWidget(self.metrics_button)
        self.model_path: Path | None = None  # the file of the model shown
        self._info: ModelInfo | None = None
        self.set_model_text("No model loaded", "Choose, add or remove models (Ctrl+L)")
        self.set_loading(False)

    def set_model_text(self, text: str, tip: str) -> None:
        """Put `text` on the model button, cut short to fit; `tip` becomes its tooltip."""
        self.model_button.set_full_text(text)
        self.model_button.setToolTip(tip)

    def set_loading(self, loading: bool) -> None:
        """Show the progress bar and Cancel while a model loads; Unload waits until it ends."""
        self.progress.setVisible(loading)
        self.cancel_button.setVisible(loading)
        self.details.setVisible(not loading)
        if loading:
            self.progress.setValue(0)
            self.progress.setFormat("Starting %p%")
            self.unload_button.setEnabled(False)

    def set_model(self, info: ModelInfo | None, context: int | None = None) -> None:
        """Name the loaded model (None: nothing loaded) and the context in use (None: the model's own)."""
        self._info = info
        if info is None:
            self.model_path = None
            self.set_model_text("No model loaded", "Choose, add or remove models (Ctrl+L)")
            self.details.setText("")
            self.unload_button.setEnabled(False)
            return
        self.model_path = info.path
        self.set_model_text(info.name, f"{info.name}\n{info.path}\nChoose, add or remove models (Ctrl+L)")
        self.set_context(context)
        self.unload_button.setEnabled(True)

    def set_download(self, text: str | None, tip: str = "") -> None:
        """Show a short download status ("↓ 45%") that opens Get models when clicked; None hides it."""
        self.download_button.setVisible(text is not None)
        self.download_button.setText(text or "")
        self.download_button.setToolTip(tip)

    def set_context(self, context: int | None) -> None:
        """Show the context the chat uses (the metrics panel's figure), and the model's own where larger."""
        info = self._info
        if info is None:
            return
        used = context or info.context_length
        ctx = f"ctx {used:,}" + (f" of {info.context_length:,}" if info.context_length > used else "")
        text = (
            f"{info.architecture} · {describe_parameters(info)} · {info.quantization} · "
            f"{format_bytes(info.file_size)} · {ctx}"
        )
        self.details.setText(text)
        self.details.setToolTip(
            f"{text}\nThe chat uses a context of {used:,} tokens (Settings, Chat); the model was trained "
            f"for {info.context_length:,}."
        )

    def set_backend(self, status: BackendStatus) -> None:
        """Show the backend in use; its details in the tooltip; a warning sign only for an idle GPU."""
        self.backend_label.setText(f"{'⚠ ' if status.warning else ''}{status.short}")
        self.backend_label.setToolTip(status.details)
        self.backend_label.setProperty("warning", bool(status.warning))
        self.backend_label.style().unpolish(self.backend_label)
        self.backend_label.style().polish(self.backend_label)
