"""Model settings…: one model file's own context length, threads, chat template, system prompt
and speculative decoding, over the app's settings (app/model_settings.py).

Each setting has a tick box: unticked, it follows the app's settings (whose value it shows).
The draft model is chosen from the library; the dialog reads the headers (on the header
reader's thread) and offers only the models that share this one's vocabulary, saying why
the others cannot draft. A template is rendered in the engine's sandbox before it is kept.
"""

from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtGui import QStandardItemModel
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QFormLayout,
    QLabel,
    QPlainTextEdit,
    QVBoxLayout,
    QWidget,
)

from app.header_reader import HeaderReader
from app.model_library import LibraryEntry
from app.model_settings import KV_TYPE_CHOICES, MODEL_SPECULATIVE, ModelSettings, check_template
from app.settings import Settings
from app.widgets.settings_dialog import SPECULATIVE_LABELS, int_box
from app.worker import Job
from engine.builtin_templates import FORMATS
from engine.draft_model import draft_refusals
from engine.model_info import ModelInfo

OWN_TEMPLATE = "own"  # the template combo's first item: the file's own template
CUSTOM_TEMPLATE = "custom"
PRECEDENCE = (
    "Ticked settings apply to this model file only, at its next load (the system prompt and the speculative "
    "mode at once). A conversation's own settings (Chat → Chat settings) still win over these."
)


class ModelSettingsDialog(QDialog):
    """The settings of the model file `entry`; after `exec()`, `model_settings()` holds the ticked ones.

    `library` lists the draft model candidates; `headers` reads them.
    """

    def __init__(
        self,
        entry: LibraryEntry,
        current: ModelSettings,
        app_settings: Settings,
        library: list[LibraryEntry],
        headers: HeaderReader,
        parent: QWidget | None = None,
    ):
        super().__init__(parent)
        self.setWindowTitle(f"Model settings — {entry.name}")
        self._entries = [entry, *(e for e in library if e.path != entry.path)]
        self._target: ModelInfo | None = None
        self._infos: dict[int, ModelInfo | str] = {}

        self.context_length = int_box("context_length", 256)
        self.context_length.setSuffix(" tokens")
        self.cpu_threads = int_box("cpu_threads", 1)
        self.cpu_threads.setSpecialValueText("One per core")
        self.template_choice = QComboBox()
        self.template_choice.addItem("The model file's own", OWN_TEMPLATE)
        for chat_format in FORMATS.values():
            self.template_choice.addItem(f"Built-in: {chat_format.name}", chat_format.key)
        self.template_choice.addItem("Custom (paste a Jinja template below)", CUSTOM_TEMPLATE)
        self.template = QPlainTextEdit(tabChangesFocus=True)
        self.template.setAccessibleName("Chat template")
        self.template.setPlaceholderText("A Jinja chat template, as in tokenizer.chat_template")
        self.template_error = QLabel(objectName="ErrorLabel", wordWrap=True)
        self.template_error.hide()
        self.system_prompt = QPlainTextEdit(tabChangesFocus=True)
        self.system_prompt.setAccessibleName("System prompt for this model")
        self.system_prompt.setFixedHeight(70)
        self.speculative = QComboBox()
        self.speculative.addItem(f"App setting ({SPECULATIVE_LABELS[app_settings.speculative]})", None)
        for mode in MODEL_SPECULATIVE:
            self.speculative.addItem(SPECULATIVE_LABELS[mode], mode)
        self.kv_type = QComboBox()
        self.kv_type.setAccessibleName("KV cache type")
        for label, kv_type in KV_TYPE_CHOICES:
            self.kv_type.addItem(label, kv_type)
        self.draft = QComboBox()
        self.draft.setAccessibleName("Draft model")
        self.draft.addItem("None", None)
        for other in self._entries[1:]:
            self.draft.addItem(f"{other.name} (reading…)", str(other.path))
        self.draft_note = QLabel(objectName="SettingsHint", wordWrap=True)

        self._ticks: dict[str, QCheckBox] = {}
        form = QFormLayout()
        for name, label, editor in (
            ("context_length", "Context length", self.context_length),
            ("cpu_threads", "CPU threads", self.cpu_threads),
            ("system_prompt", "System prompt", self.system_prompt),
        ):
            tick = self._ticks[name] = QCheckBox(label)
            tick.toggled.connect(editor.setEnabled)
            form.addRow(tick, editor)
        form.addRow("Chat template", self.template_choice)
        form.addRow(self.template)
        form.addRow(self.template_error)
        form.addRow("KV cache", self.kv_type)
        form.addRow("Speculative decoding", self.speculative)
        form.addRow("Draft model", self.draft)
        form.addRow(self.draft_note)
        self.hint = QLabel(f"{entry.path}\n\n{PRECEDENCE}", objectName="SettingsHint", wordWrap=True)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addWidget(self.hint)
        layout.addLayout(form)
        layout.addWidget(buttons)

        self._app_settings = app_settings
        self.show_settings(current)
        self.template_choice.currentIndexChanged.connect(self._template_chosen)
        self.template.textChanged.connect(self._template_edited)
        self.draft.currentIndexChanged.connect(self._draft_chosen)
        self.resize(620, 640)

        self._headers = headers
        headers.rows_read.connect(self._on_infos)
        self._job = headers.read(self._entries)
        self.finished.connect(self._stop_reading)

    def show_settings(self, settings: ModelSettings) -> None:
        """Show `settings` in the editors; unticked ones show the app's values."""
        app = self._app_settings
        for name, editor in (("context_length", self.context_length), ("cpu_threads", self.cpu_threads)):
            value = getattr(settings, name)
            self._ticks[name].setChecked(value is not None)
            editor.setEnabled(value is not None)
            editor.setValue(getattr(app, name) if value is None else value)
        self._ticks["system_prompt"].setChecked(settings.system_prompt is not None)
        self.system_prompt.setEnabled(settings.system_prompt is not None)
        self.system_prompt.setPlainText(app.system_prompt if settings.system_prompt is None else settings.system_prompt)
        source = settings.template
        builtin = next((f.key for f in FORMATS.values() if f.source == source), None)
        self.template_choice.setCurrentIndex(
            self.template_choice.findData(OWN_TEMPLATE if source is None else builtin or CUSTOM_TEMPLATE)
        )
        self.template.setPlainText(source or "")
        self.template.setEnabled(source is not None)
        self.speculative.setCurrentIndex(self.speculative.findData(settings.speculative))
        self.kv_type.setCurrentIndex(max(self.kv_type.findData(settings.kv_type), 0))
        index = self.draft.findData(settings.draft_model)
        if settings.draft_model is not None and index < 0:  # no longer in the library: kept, and said
            self.draft.addItem(f"{Path(settings.draft_model).name} (not in the library)", settings.draft_model)
            index = self.draft.count() - 1
        self.draft.setCurrentIndex(max(index, 0))

    def model_settings(self) -> ModelSettings:
        """The ticked settings (the template and draft model as chosen)."""

        def ticked(name: str, value):
            return value if self._ticks[name].isChecked() else None

        own_template = self.template_choice.currentData() == OWN_TEMPLATE
        return ModelSettings(
            context_length=ticked("context_length", self.context_length.value()),
            cpu_threads=ticked("cpu_threads", self.cpu_threads.value()),
            template=None if own_template else self.template.toPlainText(),
            system_prompt=ticked("system_prompt", self.system_prompt.toPlainText()),
            speculative=self.speculative.currentData(),
            draft_model=self.draft.currentData(),
            kv_type=self.kv_type.currentData(),
        )

    def accept(self) -> None:
        """Keep the settings, unless the template does not render: then say why, and stay open."""
        source = self.model_settings().template
        problem = None if source is None else check_template(source, *self._special_tokens())
        self.template_error.setText(problem or "")
        self.template_error.setVisible(problem is not None)
        if problem is None:
            super().accept()

    def _special_tokens(self) -> tuple[str, str]:
        """The model's BOS and EOS texts, as its template sees them ("" until its header is read)."""
        if self._target is None:
            return "", ""
        vocabulary = self._target.vocabulary
        tokens = vocabulary.get("tokenizer.ggml.tokens", [])

        def text(key: str) -> str:
            token_id = vocabulary.get(key)
            return tokens[token_id] if isinstance(token_id, int) and 0 <= token_id < len(tokens) else ""

        return text("tokenizer.ggml.bos_token_id"), text("tokenizer.ggml.eos_token_id")

    def _template_chosen(self) -> None:
        key = self.template_choice.currentData()
        self.template.setEnabled(key != OWN_TEMPLATE)
        if key in FORMATS:
            self.template.blockSignals(True)
            self.template.setPlainText(FORMATS[key].source)
            self.template.blockSignals(False)
        elif key == OWN_TEMPLATE:
            self.template.clear()

    def _template_edited(self) -> None:
        """Text typed over a built-in format makes it a custom template."""
        key = self.template_choice.currentData()
        if key in FORMATS and self.template.toPlainText() != FORMATS[key].source:
            self.template_choice.blockSignals(True)
            self.template_choice.setCurrentIndex(self.template_choice.findData(CUSTOM_TEMPLATE))
            self.template_choice.blockSignals(False)

    def _draft_chosen(self) -> None:
        index = self.draft.currentIndex()
        self.draft_note.setText(self.draft.itemData(index, Qt.ItemDataRole.ToolTipRole) or "")  # why (not)

    def _stop_reading(self) -> None:
        self._job.cancel.set()
        self._headers.rows_read.disconnect(self._on_infos)

    def _on_infos(self, job: Job, rows: list) -> None:
        if job is not self._job:
            return
        self._infos.update(rows)
        target = self._infos.get(0)
        if not isinstance(target, ModelInfo):
            return
        self._target = target
        model = self.draft.model()
        assert isinstance(model, QStandardItemModel)  # a QComboBox's own model
        for row, value in self._infos.items():
            index = self.draft.findData(str(self._entries[row].path)) if row else -1
            if index < 0:
                continue
            name = self._entries[row].name
            reasons = [value] if isinstance(value, str) else draft_refusals(target.vocabulary, value.vocabulary)
            why = (
                f"Cannot draft for this model: {'; '.join(reasons)}."
                if reasons
                else "Shares this model's vocabulary: it can draft for it."
            )
            self.draft.setItemText(index, name if not reasons else f"{name} (cannot draft)")
            self.draft.setItemData(index, why, Qt.ItemDataRole.ToolTipRole)
            model.item(index).setEnabled(not reasons or index == self.draft.currentIndex())
        self._draft_chosen()
