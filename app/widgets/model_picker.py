"""The model picker: the library as a table, with what each model needs.

Headers are read on a background thread (a large vocabulary takes seconds to read), so
the table appears at once and fills in row by row. Files that moved or cannot be read
stay listed with the reason.
"""

import threading
from pathlib import Path

from PySide6.QtCore import Qt, QUrl, Signal
from PySide6.QtGui import QBrush, QColor, QDesktopServices
from PySide6.QtWidgets import (
    QAbstractItemView, QApplication, QDialog, QFileDialog, QHBoxLayout, QHeaderView, QLabel, QLineEdit, QPushButton,
    QTableWidget, QTableWidgetItem, QVBoxLayout, QWidget,
)

from app.model_library import (
    LibraryEntry, ModelInfo, available_memory, format_bytes, format_parameters, read_model_info,
)
from app.worker import EngineThread, Job, error_message
from engine.draft_model import draft_refusals

COLUMNS = ("Model", "File", "Architecture", "Parameters", "Quantization", "File size", "Context", "Memory", "Drafts")
MODEL, FILE, ARCHITECTURE, PARAMETERS, QUANTIZATION, SIZE, CONTEXT, MEMORY, DRAFTS = range(len(COLUMNS))
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


class InfoCache:
    """Model headers already read, keyed by path, size and modification time."""

    def __init__(self) -> None:
        self._infos: dict[tuple, ModelInfo | str] = {}

    @staticmethod
    def key(path: Path) -> tuple:
        """A key that changes when the file does."""
        stat = path.stat()
        return str(path), stat.st_size, stat.st_mtime_ns

    def get(self, path: Path) -> ModelInfo | str | None:
        """The info (or the error message) for `path`, if read before."""
        try:
            return self._infos.get(self.key(path))
        except OSError:
            return None

    def put(self, path: Path, value: ModelInfo | str) -> None:
        """Remember what reading `path` gave."""
        try:
            self._infos[self.key(path)] = value
        except OSError:
            pass


def read_entries(entries: list[LibraryEntry], cache: InfoCache, cancel: threading.Event):
    """Yield (row, ModelInfo or error text) for each entry, reading headers not cached."""
    for row, entry in enumerate(entries):
        if cancel.is_set():
            return
        if not entry.path.exists():
            yield row, "File not found: it was moved or deleted. Remove it, or add it again from its new place."
            continue
        value = cache.get(entry.path)
        if value is None:
            try:
                value = read_model_info(entry.path, entry.name)
            except Exception as exc:
                value = error_message(exc)
            cache.put(entry.path, value)
        yield row, value


class ModelPicker(QDialog):
    """Choose, add or remove models. Emits `load_requested(path, name)`.

    `draft_target` is the loaded model's vocabulary metadata (ModelInfo.vocabulary): the
    Drafts column then says which models can draft for it (speculative decoding), and why
    the others cannot.
    """

    load_requested = Signal(str, str)
    add_requested = Signal(str)
    remove_requested = Signal(str)

    def __init__(self, entries: list[LibraryEntry], cache: InfoCache, n_ctx: int, models_folder: Path,
                 current: Path | None = None, parent: QWidget | None = None, backend: str = "numpy",
                 draft_target: dict | None = None):
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

        self.table = QTableWidget(len(entries), len(COLUMNS))
        self.table.setHorizontalHeaderLabels(COLUMNS)
        self.table.verticalHeader().setVisible(False)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        header = self.table.horizontalHeader()
        header.setMaximumSectionSize(MAX_COLUMN_WIDTH)  # longer texts are cut short; tooltips have them whole
        for column in range(len(COLUMNS)):  # the file name takes what the others leave
            header.setSectionResizeMode(column, QHeaderView.ResizeMode.Stretch if column == FILE
                                        else QHeaderView.ResizeMode.ResizeToContents)
        self.table.setWordWrap(False)
        self.table.setTextElideMode(Qt.TextElideMode.ElideMiddle)  # a file name's start and end tell most
        self.table.itemDoubleClicked.connect(lambda _item: self._load_selected())
        for row, entry in enumerate(entries):
            item = _Item(entry.name)
            item.setData(ENTRY, row)
            item.setToolTip(str(entry.path))
            self.table.setItem(row, MODEL, item)
            where = "bundled" if entry.bundled else entry.path.parent.name or str(entry.path.parent)
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

        self.memory_label = QLabel(f"Memory available now: {format_bytes(available_memory())} · "
                                   f"context length {n_ctx:,} tokens · {backend} backend")
        self.memory_label.setObjectName("MutedLabel")
        self.load_button = QPushButton("Load")
        self.load_button.setDefault(True)
        self.load_button.clicked.connect(self._load_selected)
        add_button = QPushButton("Add model…")
        add_button.clicked.connect(self._add)
        self.remove_button = QPushButton("Remove from library")
        self.remove_button.clicked.connect(self._remove_selected)
        folder_button = QPushButton("Open models folder")
        folder_button.clicked.connect(self._open_folder)
        close_button = QPushButton("Close")
        close_button.clicked.connect(self.reject)

        buttons = QHBoxLayout()
        for button in (add_button, self.remove_button, folder_button):
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

        self._reader = EngineThread()
        self._reader.worker.yielded.connect(self._on_infos)
        self._job = self._reader.worker.submit(Job(lambda cancel: read_entries(self._entries, cache, cancel),
                                                   "headers"))
        self.finished.connect(lambda _result: self._reader.stop(self._job))

    def info(self, row: int) -> ModelInfo | str | None:
        """What was read for `row` so far (None while reading)."""
        return self._infos.get(row)

    def wait_for_headers(self) -> None:
        """Process events until every header has been read (for tests and screenshots)."""
        while len(self._infos) < len(self._entries):
            QApplication.processEvents()

    def _table_row(self, entry: int) -> int:
        """The table row (which sorting moves) showing entry `entry`."""
        return next(row for row in range(self.table.rowCount()) if self.table.item(row, MODEL).data(ENTRY) == entry)

    def _set(self, row: int, column: int, text: str, tooltip: str | None = None, warn: bool = False,
             sort_key: float | None = None) -> None:
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

    def _on_infos(self, job: Job, rows: list) -> None:
        available = available_memory()
        for row, value in rows:
            self._infos[row] = value
            if isinstance(value, str):
                self._set(row, ARCHITECTURE, "—")
                self._set(row, MEMORY, value, tooltip=value, warn=True)
                continue
            fits, verdict = value.memory_verdict(self._n_ctx, available, self._backend)
            self._set(row, ARCHITECTURE, value.architecture)
            self._set(row, PARAMETERS, format_parameters(value.parameters), tooltip=f"{value.parameters:,} parameters",
                      sort_key=value.parameters)
            self._set(row, QUANTIZATION, value.quantization)
            self._set(row, SIZE, format_bytes(value.file_size), sort_key=value.file_size)
            self._set(row, CONTEXT, f"{value.context_length:,}", sort_key=value.context_length)
            self._set(row, MEMORY, ("" if fits else "⚠ ") + verdict, tooltip=verdict, warn=not fits)
            self._set(row, DRAFTS, *self._draft_verdict(value))
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
        return self.table.item(rows[0].row(), MODEL).data(ENTRY) if rows else None

    def _update_buttons(self) -> None:
        row = self._selected_row()
        usable = row is not None and row not in self._removed
        self.load_button.setEnabled(usable and isinstance(self._infos.get(row), ModelInfo))
        self.remove_button.setEnabled(usable and not self._entries[row].bundled)

    def _load_selected(self) -> None:
        row = self._selected_row()
        if row is None or row in self._removed or not isinstance(self._infos.get(row), ModelInfo):
            return
        entry = self._entries[row]
        self.load_requested.emit(str(entry.path), self._infos[row].name)
        self.accept()

    def _add(self) -> None:
        path, _filter = QFileDialog.getOpenFileName(self, "Add a model", str(self._models_folder),
                                                    "GGUF models (*.gguf);;All files (*)")
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

    def _open_folder(self) -> None:
        self._models_folder.mkdir(parents=True, exist_ok=True)
        QDesktopServices.openUrl(QUrl.fromLocalFile(str(self._models_folder)))
