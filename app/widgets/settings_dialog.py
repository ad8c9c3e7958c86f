"""The settings dialog, and the per-conversation sampling overrides dialog.

Both edit sampling through one `SamplingForm`. Every value that leaves a dialog goes
through app.settings' validation, the same rules as a loaded settings file.
"""

from collections.abc import Callable, Mapping
from pathlib import Path

from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QDoubleSpinBox,
    QFileDialog,
    QFormLayout,
    QGridLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QPushButton,
    QSpinBox,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from app.settings import (
    BACKENDS,
    RANGES,
    SAMPLING_FIELDS,
    SPECULATIVE,
    THEMES,
    Settings,
    effective_sampling,
    merge_settings,
)

# field: (label, tooltip, decimals or None for whole numbers, step)
_SAMPLING_SPECS: dict[str, tuple[str, str, int | None, float]] = {
    "temperature": ("Temperature", "Randomness. 0 always picks the most likely token; higher is more varied.", 2, 0.05),
    "top_k": ("Top-k", "Consider only the k most likely tokens. 0 switches this off.", None, 1),
    "top_p": ("Top-p", "Consider the fewest tokens whose probabilities add up to p. 1 switches this off.", 2, 0.01),
    "min_p": (
        "Min-p",
        "Drop tokens less likely than this fraction of the likeliest one. 0 switches this off.",
        2,
        0.01,
    ),
    "repeat_penalty": ("Repetition penalty", "Make recently used tokens less likely. 1 switches this off.", 2, 0.05),
    "max_tokens": ("Max answer length", "The longest answer, in tokens.", None, 64),
    "seed": (
        "Seed",
        "A fixed seed gives the same answer to the same prompt; Random draws a new one each time.",
        None,
        1,
    ),
}
_BACKEND_LABELS = {
    "auto": "Automatic (fastest available)",
    "cpu": "Native CPU kernels",
    "numpy": "NumPy (CPU, reference)",
    "mlx": "MLX (Apple silicon)",
    "cuda": "CUDA (NVIDIA GPU)",
}
SPECULATIVE_LABELS = {
    "auto": "Automatic (only where it is faster)",
    "ngram": "Always, copying from the conversation",
    "draft": "With the draft model (only where it is faster)",
    "off": "Off",
}


def int_box(name: str, step: int) -> QSpinBox:
    """A whole-number spin box limited to RANGES[name]."""
    low, high = RANGES[name]
    box = QSpinBox()
    box.setRange(int(low), int(high))
    box.setSingleStep(step)
    return box


def _spin_box(name: str, decimals: int | None, step: float) -> QSpinBox | QDoubleSpinBox:
    """A spin box limited to RANGES[name]: whole numbers where `decimals` is None."""
    if decimals is None:
        return int_box(name, int(step))
    box = QDoubleSpinBox(decimals=decimals)
    box.setRange(*RANGES[name])
    box.setSingleStep(step)
    return box


class SeedEditor(QWidget):
    """A seed spin box with a "Random" check box; `value()` is None when random."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.spin = int_box("seed", 1)
        self.random = QCheckBox("Random")
        self.random.toggled.connect(lambda on: self.spin.setEnabled(not on))
        layout = QHBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.spin, 1)
        layout.addWidget(self.random)

    def value(self) -> int | None:
        """The seed, or None for a random one per answer."""
        return None if self.random.isChecked() else self.spin.value()

    def setValue(self, seed: int | None) -> None:
        """Show `seed`; None ticks Random (the spin box keeps its number for later)."""
        self.random.setChecked(seed is None)
        if seed is not None:
            self.spin.setValue(seed)


class SamplingForm(QWidget):
    """Editors for the SAMPLING_FIELDS, built from `values`.

    With `overridable`, each field's label is a check box: ticked, the field overrides
    the global value for one conversation; unticked, the editor is greyed and shows the
    global value from `values`.
    """

    def __init__(self, values: Settings, overridable: bool = False, parent: QWidget | None = None):
        super().__init__(parent)
        self._globals = values
        self.editors: dict[str, QSpinBox | QDoubleSpinBox | SeedEditor] = {}
        self.checks: dict[str, QCheckBox] = {}
        grid = QGridLayout(self)
        grid.setColumnStretch(2, 1)
        for row, name in enumerate(SAMPLING_FIELDS):
            label, tip, decimals, step = _SAMPLING_SPECS[name]
            editor = SeedEditor() if name == "seed" else _spin_box(name, decimals, step)
            editor.setToolTip(tip)
            editor.setMinimumWidth(160)
            self.editors[name] = editor
            if overridable:
                check = self.checks[name] = QCheckBox(label, toolTip=tip)
                check.toggled.connect(lambda on, name=name: self._follow_check(name, on))
                grid.addWidget(check, row, 0)
            else:
                grid.addWidget(QLabel(label, toolTip=tip), row, 0)
            grid.addWidget(editor, row, 1)
        grid.setRowStretch(len(SAMPLING_FIELDS), 1)
        self.set_values(values)
        for name in self.checks:
            self._follow_check(name, False)

    def set_values(self, values: Settings) -> None:
        """Put the sampling fields of `values` into the editors."""
        for name in SAMPLING_FIELDS:
            self.editors[name].setValue(getattr(values, name))

    def values(self) -> dict[str, object]:
        """Every sampling field as the editors show it."""
        return {name: editor.value() for name, editor in self.editors.items()}

    def set_overrides(self, overrides: Mapping[str, object]) -> None:
        """Tick and fill the overridden fields, untick the rest (overridable forms only).

        Unknown keys are ignored and bad values fixed, as in effective_sampling.
        """
        merged = effective_sampling(self._globals, overrides)
        for name, check in self.checks.items():
            check.setChecked(name in overrides)
            if name in overrides:
                self.editors[name].setValue(getattr(merged, name))

    def overrides(self) -> dict[str, object]:
        """The ticked fields and their values; empty for a form that is not overridable."""
        values = self.values()
        return {name: values[name] for name, check in self.checks.items() if check.isChecked()}

    def _follow_check(self, name: str, on: bool) -> None:
        """Enable a ticked field; grey an unticked one and show its global value."""
        editor = self.editors[name]
        editor.setEnabled(on)
        if not on:
            editor.setValue(getattr(self._globals, name))


def _button_box(dialog: QDialog, restore: Callable[[], None], restore_text: str) -> QDialogButtonBox:
    """OK, Cancel and a restore button that calls `restore`, wired to `dialog`."""
    buttons = QDialogButtonBox(
        QDialogButtonBox.StandardButton.Ok
        | QDialogButtonBox.StandardButton.Cancel
        | QDialogButtonBox.StandardButton.RestoreDefaults
    )
    reset = buttons.button(QDialogButtonBox.StandardButton.RestoreDefaults)
    reset.setText(restore_text)
    reset.clicked.connect(restore)
    buttons.accepted.connect(dialog.accept)
    buttons.rejected.connect(dialog.reject)
    return buttons


def _combo(keys: tuple[str, ...], labels: Mapping[str, str]) -> QComboBox:
    """A combo box showing labels[key] (or the key) with the key as item data."""
    combo = QComboBox()
    for key in keys:
        combo.addItem(labels.get(key, key), key)
    return combo


def _select(combo: QComboBox, key: str) -> None:
    """Make the item whose data is `key` current."""
    combo.setCurrentIndex(combo.findData(key))


def _tab(*rows: tuple[str, QWidget] | QWidget) -> QWidget:
    """A tab page of form rows: (label, widget) pairs, or widgets spanning both columns."""
    page = QWidget()
    form = QFormLayout(page)
    form.setFieldGrowthPolicy(QFormLayout.FieldGrowthPolicy.ExpandingFieldsGrow)
    for row in rows:
        if isinstance(row, tuple):
            form.addRow(*row)
        else:
            form.addRow(row)
    return page


class SettingsDialog(QDialog):
    """The app's settings, in tabs: Chat, Sampling, Engine, Appearance, Models.

    `backend_reasons` (from backends.select: why each backend was passed over) is shown
    under the backend choice. After `exec()`, `settings()` is the edited copy; fields
    the dialog does not show (last_model) keep their value from `settings`.
    """

    def __init__(self, settings: Settings, backend_reasons: list[str], parent: QWidget | None = None):
        super().__init__(parent)
        self.setWindowTitle("Settings")
        self._original = settings

        self.system_prompt = QPlainTextEdit(tabChangesFocus=True)
        self.system_prompt.setPlaceholderText("Instructions the model sees before every conversation")
        self.context_length = int_box("context_length", 256)
        self.context_length.setSuffix(" tokens")
        self.context_length.setToolTip("How many tokens of the conversation the model can see at once.")
        self.saved_states = int_box("saved_states_mb", 256)
        self.saved_states.setSuffix(" MB")
        self.saved_states.setSpecialValueText("Keep none")
        self.saved_states.setToolTip(
            "Disk space for the memory of conversations you leave, so that reopening one does not "
            "read it all again; the least recently used go first."
        )
        self.sampling = SamplingForm(settings)
        self.backend = _combo(BACKENDS, _BACKEND_LABELS)
        self.cpu_threads = int_box("cpu_threads", 1)
        self.cpu_threads.setSpecialValueText("One per core")
        self.cpu_threads.setToolTip("Threads of the native CPU backend; a change reloads the model.")
        self.speculative = _combo(SPECULATIVE, SPECULATIVE_LABELS)
        self.speculative.setToolTip(
            "Speculative decoding: guess a few tokens from earlier text and let the model "
            "check them in one pass. The answers are the same; only the speed changes."
        )
        passed_over = "\n".join(["Not available on this computer:", *(f"• {r}" for r in backend_reasons)])
        reasons = QLabel(passed_over, objectName="BackendReasons", wordWrap=True)
        reasons.setVisible(bool(backend_reasons))
        self.theme = _combo(THEMES, {t: t.title() for t in THEMES})
        self.models_folder = QLineEdit()
        browse = QPushButton("Browse…", autoDefault=False)
        browse.clicked.connect(self._browse)
        folder_row = QHBoxLayout()
        folder_row.addWidget(self.models_folder, 1)
        folder_row.addWidget(browse)
        folder = QWidget()
        folder.setLayout(folder_row)
        folder_row.setContentsMargins(0, 0, 0, 0)

        self.hub_offline = QCheckBox("Work offline: never contact the Hugging Face Hub")
        self.hub_offline.setToolTip("Get models then lists only the models already downloaded; search needs a network.")

        self.tabs = QTabWidget()
        chat = _tab(
            ("System prompt", self.system_prompt),
            ("Context length", self.context_length),
            ("Saved conversations", self.saved_states),
        )
        self.tabs.addTab(chat, "Chat")
        self.tabs.addTab(self.sampling, "Sampling")
        self.tabs.addTab(
            _tab(
                ("Backend", self.backend),
                reasons,
                ("CPU threads", self.cpu_threads),
                ("Speculative decoding", self.speculative),
            ),
            "Engine",
        )
        self.tabs.addTab(_tab(("Theme", self.theme)), "Appearance")
        hint = QLabel("Where Sprig looks for .gguf model files.", objectName="SettingsHint")
        self.add_server = QPushButton("Add a server…", autoDefault=False)
        self.add_server.setToolTip("Chat with the models of an OpenAI-compatible server (llama.cpp, vLLM, Ollama, …)")
        self.tabs.addTab(_tab(("Models folder", folder), hint, self.hub_offline, self.add_server), "Models")

        layout = QVBoxLayout(self)
        layout.addWidget(self.tabs)
        layout.addWidget(_button_box(self, lambda: self.load(Settings.defaults()), "Restore defaults"))
        self.load(settings)
        self.resize(560, 420)

    def load(self, settings: Settings) -> None:
        """Show `settings` in every editor."""
        self.system_prompt.setPlainText(settings.system_prompt)
        self.context_length.setValue(settings.context_length)
        self.saved_states.setValue(settings.saved_states_mb)
        self.sampling.set_values(settings)
        _select(self.backend, settings.backend)
        self.cpu_threads.setValue(settings.cpu_threads)
        _select(self.speculative, settings.speculative)
        _select(self.theme, settings.theme)
        self.models_folder.setText(str(settings.models_folder))
        self.hub_offline.setChecked(settings.hub_offline)

    def settings(self) -> Settings:
        """The settings as edited (validated; an empty folder keeps the original one)."""
        edited = {
            "system_prompt": self.system_prompt.toPlainText(),
            "context_length": self.context_length.value(),
            "saved_states_mb": self.saved_states.value(),
            **self.sampling.values(),
            "backend": self.backend.currentData(),
            "cpu_threads": self.cpu_threads.value(),
            "speculative": self.speculative.currentData(),
            "theme": self.theme.currentData(),
            "models_folder": self.models_folder.text().strip(),
            "hub_offline": self.hub_offline.isChecked(),
        }
        return merge_settings(self._original, edited)[0]

    def _browse(self) -> None:
        """Pick the models folder with the platform's folder chooser."""
        chosen = QFileDialog.getExistingDirectory(self, "Models folder", self.models_folder.text())
        if chosen:
            self.models_folder.setText(str(Path(chosen)))


class ConversationSettingsDialog(QDialog):
    """A system prompt and sampling overrides for one conversation, over the global `settings`.

    `overrides` is the conversation's stored dict; after `exec()`, `overrides()` holds
    only the ticked fields.
    """

    def __init__(self, settings: Settings, overrides: Mapping[str, object], parent: QWidget | None = None):
        super().__init__(parent)
        self.setWindowTitle("Conversation settings")
        self.own_prompt = QCheckBox("System prompt for this conversation")
        self.system_prompt = QPlainTextEdit(tabChangesFocus=True)
        self.system_prompt.setAccessibleName("System prompt for this conversation")
        self.system_prompt.setFixedHeight(80)
        self.own_prompt.toggled.connect(self.system_prompt.setEnabled)
        self._global_prompt = settings.system_prompt
        self.form = SamplingForm(settings, overridable=True)
        self._set_overrides(overrides)
        hint = QLabel(
            "Tick a setting to change it for this conversation only. Unticked settings follow the global settings.",
            objectName="SettingsHint",
            wordWrap=True,
        )
        layout = QVBoxLayout(self)
        layout.addWidget(hint)
        layout.addWidget(self.own_prompt)
        layout.addWidget(self.system_prompt)
        layout.addWidget(self.form)
        layout.addWidget(_button_box(self, lambda: self._set_overrides({}), "Use global settings"))
        self.resize(420, 0)

    def _set_overrides(self, overrides: Mapping[str, object]) -> None:
        prompt = overrides.get("system_prompt")
        own = isinstance(prompt, str)
        self.own_prompt.setChecked(own)
        self.system_prompt.setEnabled(own)
        self.system_prompt.setPlainText(prompt if isinstance(prompt, str) else self._global_prompt)
        self.form.set_overrides(overrides)

    def overrides(self) -> dict[str, object]:
        """The ticked fields and their values."""
        own = {"system_prompt": self.system_prompt.toPlainText()} if self.own_prompt.isChecked() else {}
        return {**own, **self.form.overrides()}
