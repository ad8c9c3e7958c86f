"""Get models: find GGUF models on Hugging Face, see which fit this computer, download and load them.

The top table lists repositories: the recommended starting points (offline too), or the
results of a search, most downloaded first. Choosing one lists its GGUF files grouped
by quantization, each with a fit verdict for this computer and the recommended pick
marked (★). Download shows bytes, speed and time left, and can be paused, resumed
(after a restart too) or cancelled; a finished model loads at once. "Downloaded" lists
what is in the Hugging Face cache, which is all there is to show offline.

Every Hub call runs on the HubController's threads; this widget only shows answers.
"""

from pathlib import Path

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QBrush, QColor
from PySide6.QtWidgets import (
    QAbstractItemView,
    QDialog,
    QFrame,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QProgressBar,
    QPushButton,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app.hub_controller import HubController
from app.hub_fit import estimated_info, fit_for, fit_text
from app.worker import Job
from engine.errors import HubAccessError, HubError, HubOfflineError
from engine.hub import tokens
from engine.hub.cache import CachedModel, cached_models, find_cached
from engine.hub.connection import Hub
from engine.hub.download import Progress, Pull, bytes_on_disk, snapshot_path
from engine.hub.files import GGUFChoice, RepoFiles, list_gguf_files
from engine.hub.fit import FITS, TIGHT, Fit, recommended_choice
from engine.hub.search import RECOMMENDED, RepoSummary, search_models
from engine.model_info import ModelInfo, available_memory, format_bytes, read_model_info

REPO_COLUMNS = ("Repository", "Why", "Downloads", "Likes", "Updated", "Licence")
FILE_COLUMNS = ("", "Quantization", "File", "Size", "Fit on this computer")
CACHED_COLUMNS = ("", "Quantization", "Model", "Size", "Where it lives")
LEVEL_COLORS = {FITS: QColor("#1e8449"), TIGHT: QColor("#b9770e")}
WONT_FIT_COLOR = QColor("#c0392b")
VIEW_SIZE = (1120, 700)
ROW = Qt.ItemDataRole.UserRole  # the first cell of each file row holds its index in `_rows`


def files_with_headers(hub: Hub, repo_id: str) -> tuple[RepoFiles, dict[GGUFChoice, ModelInfo]]:
    """A repository's GGUF files, and the headers of those already in the cache (the real figures)."""
    repo = list_gguf_files(hub, repo_id)
    headers = {}
    for choice in repo.choices:
        local = snapshot_path(hub.cache_dir, Pull.of(repo, choice), choice.parts[0])
        if local.exists():
            try:
                headers[choice] = read_model_info(local)
            except Exception:  # an unreadable file is judged by the estimate instead
                continue
    return repo, headers


def _item(text: str, tooltip: str = "", align_right: bool = False) -> QTableWidgetItem:
    item = QTableWidgetItem(text)
    item.setToolTip(tooltip or text)
    if align_right:
        item.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
    return item


def _table(columns: tuple[str, ...], stretch: int) -> QTableWidget:
    table = QTableWidget(0, len(columns))
    table.setHorizontalHeaderLabels(columns)
    table.verticalHeader().setVisible(False)
    table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
    table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
    table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
    table.setWordWrap(False)
    header = table.horizontalHeader()
    for column in range(len(columns)):
        mode = QHeaderView.ResizeMode.Stretch if column == stretch else QHeaderView.ResizeMode.ResizeToContents
        header.setSectionResizeMode(column, mode)
    return table


def progress_text(progress: Progress) -> str:
    """ "312 MB of 2.50 GB · 11.4 MB/s · 3 min left" (or the stage, once the bytes are in)."""
    if progress.stage == "verifying":
        return f"Checking the SHA-256 of {progress.pull.label}…"
    text = f"{format_bytes(progress.done)} of {format_bytes(progress.total)}"
    if progress.speed > 0:
        text += f" · {format_bytes(int(progress.speed))}/s"
    eta = progress.eta_s
    if eta is not None:
        text += f" · {eta / 60:.0f} min left" if eta >= 90 else f" · {eta:.0f} s left"
    return text


class GetModelsView(QDialog):
    """Find, check, download and load models from Hugging Face. Emits `load_requested(path, name)`."""

    load_requested = Signal(str, str)

    def __init__(self, hub: HubController, n_ctx: int, backend: str, parent: QWidget | None = None):
        super().__init__(parent)
        self.setWindowTitle("Get models")
        screen = self.screen().availableGeometry() if self.screen() else None
        width, height = VIEW_SIZE
        if screen is not None:
            width, height = min(width, screen.width() - 40), min(height, screen.height() - 60)
        self.resize(width, height)
        self._hub, self._n_ctx, self._backend = hub, n_ctx, backend
        self._repos: list[RepoSummary] = []
        self._repo: RepoFiles | None = None
        self._rows: list[GGUFChoice | CachedModel] = []
        self._jobs: dict[str, Job] = {}
        self._paused: Pull | None = None
        self._finished: Progress | None = None

        self.search = QLineEdit(placeholderText="Search GGUF models on Hugging Face: qwen3, llama, gemma, bonsai…")
        self.search.setAccessibleName("Search models")
        self.search.setClearButtonEnabled(True)
        self.search.returnPressed.connect(self.run_search)
        self.search_button = QPushButton("Search", clicked=self.run_search)
        self.recommended_button = QPushButton("Recommended", clicked=self.show_recommended)
        self.downloaded_button = QPushButton("Downloaded", clicked=self.show_downloaded)
        self.notice = QLabel(wordWrap=True, objectName="MutedLabel")
        self.notice.setOpenExternalLinks(True)
        self.repos = _table(REPO_COLUMNS, REPO_COLUMNS.index("Why"))
        self.repos.itemSelectionChanged.connect(self._on_repo_selected)
        self.repo_label = QLabel(wordWrap=True)
        self.repo_label.setOpenExternalLinks(True)
        self.files = _table(FILE_COLUMNS, FILE_COLUMNS.index("File"))
        self.files.itemSelectionChanged.connect(self._update_buttons)
        self.files.itemDoubleClicked.connect(lambda _item: self._download_or_load())

        self.token_row = QFrame()
        self.token_row.setObjectName("InfoBanner")
        self.token_row.hide()
        self.token_label = QLabel(wordWrap=True)
        self.token_label.setOpenExternalLinks(True)
        self.token = QLineEdit(placeholderText="hf_…", echoMode=QLineEdit.EchoMode.Password)
        self.token.setAccessibleName("Hugging Face access token")
        self.save_token_button = QPushButton("Save token", clicked=self._save_token)
        token_layout = QHBoxLayout(self.token_row)
        token_layout.addWidget(self.token_label, 1)
        token_layout.addWidget(self.token)
        token_layout.addWidget(self.save_token_button)

        self.progress = QProgressBar(textVisible=True)
        self.progress.hide()
        self.progress.setRange(0, 1000)
        self.progress.setAccessibleName("Download progress")
        self.progress.setMaximumWidth(220)
        self.status = QLabel(objectName="MutedLabel", wordWrap=True)
        self.pause_button = QPushButton("Pause", clicked=self._pause_or_resume, visible=False)
        self.cancel_button = QPushButton("Cancel download", clicked=self._cancel, visible=False)
        self.download_button = QPushButton("Download", clicked=self._download)
        self.load_button = QPushButton("Load", clicked=self._load)
        self.load_button.setDefault(True)
        close_button = QPushButton("Close", clicked=self.reject)

        search_row = QHBoxLayout()
        for widget in (self.search, self.search_button, self.recommended_button, self.downloaded_button):
            search_row.addWidget(widget, 1 if widget is self.search else 0)
        bottom = QHBoxLayout()
        bottom.addWidget(self.progress, 1)
        bottom.addWidget(self.status, 2)
        for button in (self.pause_button, self.cancel_button, self.download_button, self.load_button, close_button):
            bottom.addWidget(button)
        layout = QVBoxLayout(self)
        layout.addLayout(search_row)
        layout.addWidget(self.notice)
        layout.addWidget(self.repos, 3)
        layout.addWidget(self.repo_label)
        layout.addWidget(self.files, 4)
        layout.addWidget(self.token_row)
        layout.addLayout(bottom)

        hub.answered.connect(self._on_answered)
        hub.failed.connect(self._on_failed)
        hub.progress.connect(self._on_progress)
        hub.download_finished.connect(self._on_download_finished)
        hub.download_stopped.connect(self._on_download_stopped)
        self.finished.connect(self._disconnect)

        self.show_recommended()
        if hub.hub().is_offline:
            self.show_downloaded()
        if hub.running is not None and hub.last is not None:
            self._on_progress(hub.last)
        elif pending := hub.pending():
            self._show_paused(pending[0])
        self._update_buttons()

    # -- repositories ------------------------------------------------------------------

    def show_recommended(self) -> None:
        """List the recommended starting points (no network needed)."""
        self._fill_repos(list(RECOMMENDED))
        offline = self._hub.hub().is_offline
        self.notice.setText(
            "Offline: search needs a network. Downloaded models are listed below."
            if offline
            else "Recommended starting points. Search finds every GGUF model on Hugging Face."
        )

    def run_search(self) -> None:
        """Search the Hub for GGUF repositories named like the search box's text."""
        text = self.search.text().strip()
        if not text:
            self.show_recommended()
            return
        self.notice.setText(f"Searching Hugging Face for “{text}”…")
        self._jobs["search"] = self._hub.query(lambda hub: search_models(hub, text), "search")

    def _fill_repos(self, repos: list[RepoSummary]) -> None:
        self._repos = repos
        self.repos.setColumnHidden(REPO_COLUMNS.index("Why"), not any(repo.why for repo in repos))
        self.repos.setRowCount(len(repos))
        for row, repo in enumerate(repos):
            updated = repo.last_modified.date().isoformat() if repo.last_modified else ""
            figures = (
                _item(repo.repo_id + ("  🔒" if repo.gated else ""), repo.repo_id),
                _item(repo.why),
                _item(f"{repo.downloads:,}" if repo.downloads is not None else "", align_right=True),
                _item(f"{repo.likes:,}" if repo.likes is not None else "", align_right=True),
                _item(updated),
                _item(repo.license or ""),
            )
            for column, item in enumerate(figures):
                self.repos.setItem(row, column, item)

    def _on_repo_selected(self) -> None:
        rows = self.repos.selectionModel().selectedRows()
        if not rows:
            return
        repo_id = self._repos[rows[0].row()].repo_id
        self.token_row.hide()
        if self._hub.hub().is_offline:
            self.repo_label.setText(f"{repo_id}: listing its files needs a network (offline).")
            return
        self.repo_label.setText(f"Reading the files of {repo_id}…")
        self._jobs["files"] = self._hub.query(lambda hub: files_with_headers(hub, repo_id), "files")

    # -- files ---------------------------------------------------------------------------

    def _fill_files(self, repo: RepoFiles, headers: dict[GGUFChoice, ModelInfo]) -> None:
        """Show `repo`'s models with their fit on this computer; select the recommended pick."""
        self._repo, self._rows = repo, list(repo.choices)
        available = available_memory()
        fits: dict[GGUFChoice, Fit] = {}
        texts: dict[GGUFChoice, str] = {}
        for choice in repo.choices:
            info = headers.get(choice) or estimated_info(repo, choice)
            fits[choice] = fit_for(info, self._n_ctx, available, self._backend, estimated=choice not in headers)
            texts[choice] = fit_text(fits[choice], info.architecture)
        pick = recommended_choice(repo.choices, fits)
        self._set_file_columns(FILE_COLUMNS)
        self.files.setRowCount(len(repo.choices))
        for row, choice in enumerate(repo.choices):
            mark = _item("★" if choice == pick else "", "Recommended: the largest that fits comfortably")
            mark.setData(ROW, row)
            size = _item(format_bytes(choice.size), f"{choice.size:,} bytes", align_right=True)
            fit = _item(texts[choice])
            fit.setForeground(QBrush(LEVEL_COLORS.get(fits[choice].level, WONT_FIT_COLOR)))
            for column, item in enumerate((mark, _item(choice.quant), _item(choice.name, choice.path), size, fit)):
                self.files.setItem(row, column, item)
        if pick is not None:
            self.files.selectRow(repo.choices.index(pick))
        gated = f" · gated: accept its licence at <a href='{self._hub.hub().repo_url(repo.repo_id)}'>its page</a>"
        self.repo_label.setText(
            f"<b>{repo.repo_id}</b>{' · ' + repo.license if repo.license else ''}{gated if repo.gated else ''} · "
            f"{format_bytes(available)} of memory free · context {self._n_ctx:,} tokens · {self._backend} backend"
        )
        self._update_buttons()

    def show_downloaded(self) -> None:
        """List the models in the Hugging Face cache: where they live, and loadable offline."""
        models = cached_models(self._hub.hub().cache_dir)
        self._repo, self._rows = None, list(models)
        self._set_file_columns(CACHED_COLUMNS)
        self.files.setRowCount(len(models))
        for row, model in enumerate(models):
            first = _item("")
            first.setData(ROW, row)
            size = _item(format_bytes(model.size), f"{model.size:,} bytes", align_right=True)
            name = _item(f"{model.repo_id} · {model.name}")
            for column, item in enumerate((first, _item(model.quant), name, size, _item(str(model.path)))):
                self.files.setItem(row, column, item)
        where = self._hub.hub().cache_dir
        self.repo_label.setText(
            f"{len(models)} model{'s' if len(models) != 1 else ''} downloaded, in the Hugging Face cache ({where}), "
            "shared with llama.cpp and other tools."
        )
        self._update_buttons()

    def _set_file_columns(self, columns: tuple[str, ...]) -> None:
        self.files.setRowCount(0)
        self.files.setHorizontalHeaderLabels(columns)

    def _selected(self) -> GGUFChoice | CachedModel | None:
        rows = self.files.selectionModel().selectedRows()
        if not rows:
            return None
        item = self.files.item(rows[0].row(), 0)
        return self._rows[item.data(ROW)] if item is not None else None

    def _local_path(self, selected: GGUFChoice | CachedModel | None) -> Path | None:
        """Where the selected model is on disk, if it is downloaded (complete)."""
        if isinstance(selected, CachedModel):
            return selected.path
        if selected is None or self._repo is None:
            return None
        pull = Pull.of(self._repo, selected)
        cache = self._hub.hub().cache_dir
        paths = [snapshot_path(cache, pull, part) for part in selected.parts]
        return paths[0] if all(p.exists() for p in paths) else None

    # -- downloading -----------------------------------------------------------------------

    def _update_buttons(self) -> None:
        selected = self._selected()
        local = self._local_path(selected)
        running = self._hub.running is not None
        self.download_button.setEnabled(isinstance(selected, GGUFChoice) and local is None and not running)
        self.load_button.setEnabled(local is not None)
        self.download_button.setToolTip("" if not running else "Another download is running; one at a time.")

    def _download_or_load(self) -> None:
        if self.load_button.isEnabled():
            self._load()
        else:
            self._download()

    def _download(self) -> None:
        selected = self._selected()
        if not isinstance(selected, GGUFChoice) or self._repo is None:
            return
        self.token_row.hide()
        pull = Pull.of(self._repo, selected)
        if self._paused is not None and self._paused != pull:
            self._hub.discard(self._paused)  # one unfinished download at a time: the new one replaces it
        self._start(pull)

    def _start(self, pull: Pull) -> None:
        if not self._hub.start(pull):
            self.notice.setText("Another download is running; wait for it, or cancel it first.")
            return
        self._paused, self._finished = None, None
        self.progress.setVisible(True)
        self.progress.setValue(0)
        self.progress.setFormat("%p%")
        self.status.setText("Starting…")
        self.pause_button.setText("Pause")
        self.pause_button.setVisible(True)
        self.cancel_button.setVisible(True)
        self._update_buttons()

    def _show_paused(self, pull: Pull) -> None:
        """A download paused (now or in an earlier session): offer Resume and Cancel."""
        self._paused = pull
        kept = bytes_on_disk(self._hub.hub().cache_dir, pull)
        self.progress.setVisible(True)
        self.progress.setValue(int(1000 * kept / max(pull.choice.size, 1)))
        self.progress.setFormat("%p%")
        self.status.setText(
            f"{pull.label} paused: {format_bytes(kept)} of {format_bytes(pull.choice.size)} kept. Resume continues."
        )
        self.pause_button.setText("Resume")
        self.pause_button.setVisible(True)
        self.cancel_button.setVisible(True)
        self._update_buttons()

    def _pause_or_resume(self) -> None:
        if self._paused is not None:
            self._start(self._paused)
        else:
            self._hub.pause()

    def _cancel(self) -> None:
        if self._paused is not None:
            self._hub.discard(self._paused)
            self._paused = None
            self._reset_download_row("Download cancelled; its partial file was removed.")
        else:
            self._hub.cancel()

    def _reset_download_row(self, text: str) -> None:
        self.progress.setVisible(False)
        self.pause_button.setVisible(False)
        self.cancel_button.setVisible(False)
        self.status.setText(text)
        self._update_buttons()

    def _on_progress(self, progress: Progress) -> None:
        self.progress.setVisible(True)
        self.progress.setFormat("%p%")
        self.progress.setValue(int(1000 * progress.done / max(progress.total, 1)))
        self.status.setText(f"{progress.pull.label} · {progress_text(progress)}")
        self.pause_button.setVisible(True)
        self.cancel_button.setVisible(True)

    def _on_download_finished(self, progress: Progress) -> None:
        self._finished = progress
        self._reset_download_row(f"{progress.pull.label} is downloaded and verified (SHA-256): {progress.path}")
        if self._repo is not None:
            self._fill_files(self._repo, {})
        path = str(progress.path)
        for row in range(self.files.rowCount()):  # select what just arrived, ready to load
            if self._local_path(self._rows[row]) == progress.path:
                self.files.selectRow(row)
        self.load_button.setEnabled(True)
        self.load_button.setToolTip(path)

    def _on_download_stopped(self, pull: Pull, error: object) -> None:
        if error is None:
            if pull is not None and self._hub.pending() and pull in self._hub.pending():
                self._show_paused(pull)
            else:
                self._reset_download_row("Download cancelled; its partial file was removed.")
            return
        self._reset_download_row("")
        self._show_error(error)

    # -- errors, tokens, loading -----------------------------------------------------------

    def _on_answered(self, job: Job, result: object) -> None:
        if job is self._jobs.get("search"):
            assert isinstance(result, list)
            self._fill_repos(result)
            self.notice.setText(
                f"{len(result)} GGUF repositor{'ies' if len(result) != 1 else 'y'} for “{self.search.text().strip()}”, "
                "most downloaded first."
                if result
                else f"No GGUF model on Hugging Face matches “{self.search.text()}”."
            )
        elif job is self._jobs.get("files"):
            assert isinstance(result, tuple)
            self._fill_files(*result)

    def _on_failed(self, job: Job, error: object) -> None:
        if job in self._jobs.values():
            self._show_error(error)

    def _show_error(self, error: object) -> None:
        """Say what went wrong; offline, list what is downloaded; a gated model, ask for a token."""
        self.notice.setText(str(error))
        if isinstance(error, HubOfflineError):
            self.show_downloaded()
        if isinstance(error, HubAccessError):
            self.token_label.setText(str(error))
            self.token_row.show()
            self.token.setFocus()

    def _save_token(self) -> None:
        try:
            tokens.save_token(self.token.text())
        except HubError as exc:
            self.token_label.setText(str(exc))
            return
        self.token.clear()
        self.token_row.hide()
        self.notice.setText("Token saved in the system keyring. Download again to use it.")

    def _load(self) -> None:
        selected = self._selected()
        path = self._local_path(selected)
        if path is None:
            return
        cached = selected if isinstance(selected, CachedModel) else find_cached(self._hub.hub().cache_dir, path)
        self.load_requested.emit(str(path), cached.name if cached else path.stem)
        self.accept()

    def _disconnect(self) -> None:
        """The view closed: the controller (and a running download) live on without it."""
        for signal, slot in (
            (self._hub.answered, self._on_answered),
            (self._hub.failed, self._on_failed),
            (self._hub.progress, self._on_progress),
            (self._hub.download_finished, self._on_download_finished),
            (self._hub.download_stopped, self._on_download_stopped),
        ):
            signal.disconnect(slot)
