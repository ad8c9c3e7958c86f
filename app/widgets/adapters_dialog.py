"""The LoRA adapters of one conversation: those listed under the loaded model, each on or
off, with its scale (app/adapter_library.py)."""

from pathlib import Path

from PySide6.QtWidgets import (
    QCheckBox,
    QDialog,
    QDialogButtonBox,
    QDoubleSpinBox,
    QGridLayout,
    QLabel,
    QVBoxLayout,
    QWidget,
)

from app.adapter_library import ADAPTERS_FOLDER, SCALE_RANGE, AdapterFile


class AdaptersDialog(QDialog):
    """Check the adapters this conversation's answers run with, and set their scales."""

    def __init__(
        self,
        model_name: str,
        adapters: list[AdapterFile],
        chosen: list[tuple[str, float]],
        models_folder: Path,
        parent: QWidget | None = None,
    ):
        super().__init__(parent)
        self.setWindowTitle("Adapters")
        layout = QVBoxLayout(self)
        scales = dict(chosen)
        self.rows: list[tuple[AdapterFile, QCheckBox, QDoubleSpinBox]] = []
        if adapters:
            layout.addWidget(QLabel(f"LoRA adapters for {model_name}, for this conversation:"))
            grid = QGridLayout()
            for row, adapter in enumerate(adapters):
                check = QCheckBox(adapter.name)
                check.setToolTip(str(adapter.path))
                check.setChecked(str(adapter.path) in scales)
                scale = QDoubleSpinBox()
                scale.setRange(*SCALE_RANGE)
                scale.setSingleStep(0.1)
                scale.setValue(scales.get(str(adapter.path), 1.0))
                scale.setAccessibleName(f"Scale of {adapter.name}")
                grid.addWidget(check, row, 0)
                grid.addWidget(QLabel("scale"), row, 1)
                grid.addWidget(scale, row, 2)
                self.rows.append((adapter, check, scale))
            layout.addLayout(grid)
        else:
            note = QLabel(
                f"No adapter in {models_folder / ADAPTERS_FOLDER} fits {model_name}. Put LoRA adapters there as GGUF "
                "files (llama.cpp's convert_lora_to_gguf.py converts a PEFT adapter)."
            )
            note.setWordWrap(True)
            layout.addWidget(note)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        layout.addWidget(buttons)

    def chosen(self) -> list[tuple[str, float]]:
        """The checked adapters (file, scale), in the listed order."""
        return [(str(adapter.path), scale.value()) for adapter, check, scale in self.rows if check.isChecked()]
