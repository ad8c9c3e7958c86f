"""The model picker: the library as a table, with what each model needs.

Headers are read by the controller's `HeaderReader`, on a thread of its own, so the
table appears at once and fills in row by row. Files that moved or cannot be read
stay listed with the reason.
"""

from pathlib import Path

from PySide6.QtCore import Qt, QUrl, Signal
from PySide6.QtGui import QBrush, QColor, QDesktopServices
from PySide6.QtWidgets import (
    QAbstractItemView,
    QApplication,
    QDialog,
    QFileDialog,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QMessageBox,
    QPushButton,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app.adapter_library import ADAPTERS_FOLDER, adapters_for, find_adapters
from app.header_reader import HeaderReader
from app.model_library import LibraryEntry
from app.worker import Job
from engine.draft_model import draft_refusals
from engine.hub.cache import CachedModel
from engine.model_info import ModelInfo, available_memory, describe_parameters, format_bytes

COLUMNS = (
    "Model",
    "File",
    "Architecture",
    "Parameters",
    "Quantization",
    "File size",
    "Context",
    "Memory",
    "Drafts",
    "Adapters",
)
MODEL, FILE, ARCHITECTURE, PARAMETERS, QUANTIZATION, SIZE, CONTEXT, MEMORY, DRAFTS, ADAPTERS = range(len(COLUMNS))
NUMERIC = (PARAMETERS, SIZE, CONTEXT)
PICKER_WIDTH = 1200  # room for every column on a screen that has it
MAX_COLUMN_WIDTH = 320
ENTRY = Qt.ItemDataRole.UserRole  # column MODEL's item holds the row's index in the entries
SORT_KEY = Qt.ItemDataRole.UserRole + 1  # a number to sort by, where the text is not one
WARNING_COLOR = QColor("#c0392b")


class _Item(QTableWidgetItem):
    """A table cell that sorts by its SORT_KEY when it has one, else by its text, ignoring case."""

    def __lt__(self, other: QTableWidgetItem) -> bool:
        mine, theirs = self.data(SORT_KEY), other.data(SORT_KEY)
        if mine is not None and theirs is not None:
            return mine < theirs
        return self.text().casefold() < other.text().casefold()


class ModelPicker(QDialog):
    """Choose, add or remove models. Emits `load_requested(path, name)`.

    `downloads` maps the files of models downloaded from Hugging Face to their cache
    entries: the File column says which repository they came from, and Delete download
    removes one from the disk (`delete_download_requested(path)`, after a confirmation
    that gives its size). Get models… asks the window for the Hub view.

    `draft_target` is the loaded model's vocabulary metadata (ModelInfo.vocabulary): the
    Drafts column then says which models can draft for it (speculative decoding), and why
    the others cannot.
    """

    load_requested = Signal(str, str)
    add_requested = Signal(str)
    remove_requested = Signal(str)
    delete_download_requested = Signal(str)
    get_models_requested = Signal()
    settings_requested = Signal(str, str)  # path, name: open Model settings… for it

    def __init__(
        self,
        entries: list[LibraryEntry],
        headers: HeaderReader,
        n_ctx: int,
        models_folder: Path,
        current: Path | None = None,
        parent: QWidget | None = None,
        backend: str = "numpy",
        draft_target: dict | None = None,
        downloads: dict[Path, CachedModel] | None = None,
    ):
        super().__init__(parent)
        self.setWindowTitle("Models")
        room = self.screen().availableGeometry().width() - 40 if self.screen() else PICKER_WIDTH
        self.resize(min(PICKER_WIDTH, room), 420)
        self._entries = list(entries)
        self._removed: set[int] = set()
        self._n_ctx = n_ctx
        self._backend = backend  # the one that will run a model: the memory estimate depends on it
        self._models_folder = models_folder
        self._current = current
        self._draft_target = draft_target
        self._infos: dict[int, ModelInfo | str] = {}
        self._downloads = downloads or {}
        self._adapters = find_adapters(models_folder)  # small headers: read here

        self.table = QTableWidget(len(entries), len(COLUMNS))
        self.table.setHorizontalHeaderLabels(COLUMNS)
        self.table.verticalHeader().setVisible(False)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        header = self.table.horizontalHeader()
        header.setMaximumSectionSize(MAX_COLUMN_WIDTH)  # longer texts are cut short; tooltips have them whole
        for column in range(len(COLUMNS)):  # the file name takes what the others leave
            header.setSectionResizeMode(
                column, QHeaderView.ResizeMode.Stretch if column == FILE else QHeaderView.ResizeMode.ResizeToContents
            )
        self.table.setWordWrap(False)
        self.table.setTextElideMode(Qt.TextElideMode.ElideMiddle)  # a file name's start and end tell most
        self.table.itemDoubleClicked.connect(lambda _item: self._load_selected())
        for row, entry in enumerate(entries):
            item = _Item(entry.name)
            item.setData(ENTRY, row)
            item.setToolTip(str(entry.path))
            self.table.setItem(row, MODEL, item)
            download = self._downloads.get(entry.path)
            where = (
                "bundled"
                if entry.bundled
                else f"Hugging Face · {download.repo_id}"
                if download
                else entry.path.parent.name or str(entry.path.parent)
            )
            self._set(row, FILE, f"{entry.path.name} — {where}", tooltip=str(entry.path))
            self._set(row, MEMORY, "reading…")
            if current is not None and entry.path == current:
                self.table.selectRow(row)
        self.table.setSortingEnabled(True)
        self.table.sortByColumn(-1, Qt.SortOrder.AscendingOrder)  # sortable on a click; the library's order first
        self.filter = QLineEdit(placeholderText="Filter by name, file, architecture or quantization…")
        self.filter.setAccessibleName("Filter models")
        self.filter.setClearButtonEnabled(True)
        self.filter.textChanged.connect(self._apply_filter)

        self.memory_label = QLabel(
            f"Memory available now: {format_bytes(available_memory())} · "
            f"context length {n_ctx:,} tokens · {backend} backend"
        )
        self.memory_label.setObjectName("MutedLabel")
        self.load_button = QPushButton("Load")
        self.load_button.setDefault(True)
        self.load_button.clicked.connect(self._load_selected)
        add_button = QPushButton("Add model…")
        add_button.clicked.connect(self._add)
        self.settings_button = QPushButton("Model settings…")
        self.settings_button.setToolTip("This model's own context length, template, system prompt and draft model")
        self.settings_button.clicked.connect(self._settings_selected)
        self.remove_button = QPushButton("Remove from library")
        self.remove_button.clicked.connect(self._remove_selected)
        self.delete_button = QPushButton("Delete download…")
        self.delete_button.setToolTip("Delete a model downloaded from Hugging Face from the disk")
        self.delete_button.clicked.connect(self._delete_selected)
        get_button = QPushButton("Get models…")
        get_button.setToolTip("Find and download models from Hugging Face")
        get_button.clicked.connect(self._get_models)
        folder_button = QPushButton("Open models folder")
        folder_button.clicked.connect(self._open_folder)
        close_button = QPushButton("Close")
        close_button.clicked.connect(self.reject)

        buttons = QHBoxLayout()
        for button in (
            get_button,
            add_button,
            self.settings_button,
            self.remove_button,
            self.delete_button,
            folder_button,
        ):
            buttons.addWidget(button)
        buttons.addStretch(1)
        buttons.addWidget(close_button)
        buttons.addWidget(self.load_button)
        layout = QVBoxLayout(self)
        layout.addWidget(self.filter)
        layout.addWidget(self.table, 1)
        layout.addWidget(self.memory_label)
        layout.addLayout(buttons)
        self.table.itemSelectionChanged.connect(self._update_buttons)
        self._update_buttons()

        self._headers = headers
        headers.rows_read.connect(self._on_infos)
        self._job = headers.read(self._entries)
        self.finished.connect(self._stop_reading)

    def info(self, row: int) -> ModelInfo | str | None:
        """What was read for `row` so far (None while reading)."""
        return self._infos.get(row)

    def wait_for_headers(self) -> None:
        """Process events until every header has been read (for tests and screenshots)."""
        while len(self._infos) < len(self._entries):
            QApplication.processEvents()

    def _table_row(self, entry: int) -> int:
        """The table row (which sorting moves) showing entry `entry`."""
        return next(row for row in range(self.table.rowCount()) if self._entry_at(row) == entry)

    def _entry_at(self, table_row: int) -> int:
        """The entry shown in table row `table_row` (its MODEL cell holds the index)."""
        item = self.table.item(table_row, MODEL)
        assert item is not None  # every row's MODEL cell is set when the table is built
        return item.data(ENTRY)

    def _set(
        self,
        row: int,
        column: int,
        text: str,
        tooltip: str | None = None,
        warn: bool = False,
        sort_key: float | None = None,
    ) -> None:
        """Fill the cell of entry `row` in `column`."""
        item = _Item(text)
        if tooltip:
            item.setToolTip(tooltip)
        if warn:
            item.setForeground(QBrush(WARNING_COLOR))
        if column in NUMERIC:
            item.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
            item.setData(SORT_KEY, sort_key)
        sorting = self.table.isSortingEnabled()
        self.table.setSortingEnabled(False)  # or the row would move while it is being filled
        self.table.setItem(self._table_row(row), column, item)
        self.table.setSortingEnabled(sorting)

    def _stop_reading(self) -> None:
        """The picker closed: its rows are no longer wanted."""
        self._job.cancel.set()
        self._headers.rows_read.disconnect(self._on_infos)

    def _on_infos(self, job: Job, rows: list) -> None:
        if job is not self._job:  # another picker's rows
            return
        available = available_memory()
        for row, value in rows:
            self._infos[row] = value
            if isinstance(value, str):
                self._set(row, ARCHITECTURE, "—")
                self._set(row, MEMORY, value, tooltip=value, warn=True)
                continue
            fits, verdict = value.memory_verdict(self._n_ctx, available, self._backend)
            self._set(row, ARCHITECTURE, value.architecture)
            self._set(
                row,
                PARAMETERS,
                describe_parameters(value),
                tooltip=f"{value.parameters:,} parameters"
                + (f", {value.active_parameters:,} read per token" if value.active_parameters else ""),
                sort_key=value.parameters,
            )
            self._set(row, QUANTIZATION, value.quantization)
            self._set(row, SIZE, format_bytes(value.file_size), sort_key=value.file_size)
            self._set(row, CONTEXT, f"{value.context_length:,}", sort_key=value.context_length)
            self._set(row, MEMORY, ("" if fits else "⚠ ") + verdict, tooltip=verdict, warn=not fits)
            self._set(row, DRAFTS, *self._draft_verdict(value))
            self._set(row, ADAPTERS, *self._adapters_cell(value))
        self._apply_filter(self.filter.text())
        self._update_buttons()

    def _draft_verdict(self, info: ModelInfo) -> tuple[str, str]:
        """The Drafts cell: whether `info`'s model can draft for the loaded one, and why not."""
        if self._draft_target is None:
            return "—", "Load a model to see which models can draft for it."
        if info.path == self._current:
            return "loaded", "This is the loaded model."
        reasons = draft_refusals(self._draft_target, info.vocabulary)
        if reasons:
            return "no", "Cannot draft for the loaded model: " + "; ".join(reasons) + "."
        return "yes", "Shares the loaded model's vocabulary: it can draft for it (speculative decoding)."

    def _adapters_cell(self, info: ModelInfo) -> tuple[str, str]:
        """The Adapters cell: how many LoRA adapters of the models folder fit `info`'s model, and which."""
        fitting = adapters_for(info.architecture, [info.name, info.path.stem], self._adapters)
        if not fitting:
            return "—", f"No LoRA adapter in {self._models_folder / ADAPTERS_FOLDER} fits this model."
        names = ", ".join(a.name for a in fitting)
        return str(len(fitting)), f"{names}. Chat → Adapters… turns them on for a conversation."

    def _apply_filter(self, text: str) -> None:
        """Show only the rows whose name, file, architecture or quantization contain `text`."""
        needle = text.strip().casefold()
        for row in range(self.table.rowCount()):
            cells = (self.table.item(row, column) for column in (MODEL, FILE, ARCHITECTURE, QUANTIZATION))
            shown = not needle or any(cell is not None and needle in cell.text().casefold() for cell in cells)
            self.table.setRowHidden(row, not shown)

    def _selected_row(self) -> int | None:
        """The entry of the selected row, if any."""
        rows = self.table.selectionModel().selectedRows()
        return self._entry_at(rows[0].row()) if rows else None

    def _update_buttons(self) -> None:
        row = self._selected_row()
        usable = row is not None and row not in self._removed
        self.load_button.setEnabled(row is not None and usable and isinstance(self._infos.get(row), ModelInfo))
        self.settings_button.setEnabled(row is not None and usable and self._entries[row].path.exists())
        self.remove_button.setEnabled(row is not None and usable and not self._entries[row].bundled)
        deletable = (
            row is not None and self._entries[row].path in self._downloads and self._entries[row].path != self._current
        )
        self.delete_button.setEnabled(usable and deletable)  # the loaded model is unloaded first

    def _load_selected(self) -> None:
        row = self._selected_row()
        info = self._infos.get(row) if row is not None else None
        if row is None or row in self._removed or not isinstance(info, ModelInfo):
            return
        self.load_requested.emit(str(self._entries[row].path), info.name)
        self.accept()

    def _settings_selected(self) -> None:
        row = self._selected_row()
        if row is not None:
            entry = self._entries[row]
            self.settings_requested.emit(str(entry.path), entry.name)

    def _add(self) -> None:
        path, _filter = QFileDialog.getOpenFileName(
            self, "Add a model", str(self._models_folder), "GGUF models (*.gguf);;All files (*)"
        )
        if path:
            self.add_requested.emit(path)
            self.accept()

    def _remove_selected(self) -> None:
        row = self._selected_row()
        if row is None or self._entries[row].bundled or row in self._removed:
            return
        self.remove_requested.emit(str(self._entries[row].path))
        self._removed.add(row)
        self._set(row, MEMORY, "removed from the library (the file itself was not deleted)")
        self.table.clearSelection()

    def _delete_selected(self) -> None:
        row = self._selected_row()
        download = self._downloads.get(self._entries[row].path) if row is not None else None
        if row is None or download is None or row in self._removed:
            return
        answer = QMessageBox.question(
            self,
            "Delete download",
            f"Delete {download.name} from {download.repo_id}? It frees {format_bytes(download.size)} "
            f"of disk.\n\n{download.path}",
        )
        if answer != QMessageBox.StandardButton.Yes:
            return
        self.delete_download_requested.emit(str(download.path))
        self._removed.add(row)
        self._set(row, MEMORY, f"deleted: {format_bytes(download.size)} freed")
        self.table.clearSelection()

    def _get_models(self) -> None:
        self.get_models_requested.emit()
        self.accept()

    def _open_folder(self) -> None:
        self._models_folder.mkdir(parents=True, exist_ok=True)
        QDesktopServices.openUrl(QUrl.fromLocalFile(str(self._models_folder)))
