"""The main window: wiring between the widgets and the chat controller.

Layout: the conversation sidebar on the left; in the middle the model bar (model picker,
backend, load progress), banners, the chat view and the message box; the collapsible
metrics panel on the right. Widgets only talk to the controller through its methods and
signals, so every engine call stays on the engine thread.
"""

import json
from dataclasses import replace
from pathlib import Path

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtGui import QCloseEvent, QDragEnterEvent, QDropEvent, QGuiApplication, QShowEvent
from PySide6.QtWidgets import (
    QApplication,
    QFileDialog,
    QHBoxLayout,
    QLabel,
    QMainWindow,
    QMessageBox,
    QPushButton,
    QSplitter,
    QStackedWidget,
    QVBoxLayout,
    QWidget,
)

from app.adapter_library import adapters_for, conversation_adapters, find_adapters, with_adapters
from app.backend_status import backend_status, gpu_present
from app.chat_controller import ChatController
from app.hub_controller import HubController
from app.local_server import LocalServer
from app.menu_bar import build_menu_bar
from app.model_library import LibraryEntry, library_entries
from app.model_settings import ModelSettings
from app.server_key import ServerKeyError, save_key, stored_key
from app.settings import RANGES, Settings, save_settings
from app.storage import Conversation, StorageError, Store
from app.theme import app_icon, apply_theme
from app.transcript import TranscriptError, import_json, read_json_file, to_json, to_markdown
from app.widgets.adapters_dialog import AdaptersDialog
from app.widgets.banner import Banner
from app.widgets.chat_view import ChatView
from app.widgets.completion_view import CompletionView
from app.widgets.conversation_list import ConversationList
from app.widgets.get_models_view import GetModelsView, progress_text
from app.widgets.message_input import MessageInput
from app.widgets.metrics_panel import MetricsPanel
from app.widgets.model_bar import ModelBar
from app.widgets.model_picker import ModelPicker
from app.widgets.model_settings_dialog import ModelSettingsDialog
from app.widgets.remote_models import RemoteModels
from app.widgets.server_form import AddServerDialog
from app.widgets.server_panel import ServerPanel
from app.widgets.server_settings_dialog import ServerSettingsDialog
from app.widgets.settings_dialog import ConversationSettingsDialog, SettingsDialog
from app.window_geometry import fit_frame, place_first_window, restore_geometry, saved_geometry
from backends.selection import planned_backend
from engine.errors import SprigError
from engine.hub.cache import cached_models, delete_download, find_cached
from engine.hub.download import Progress, Pull
from engine.model_info import ModelInfo, vocabulary_metadata
from engine.remote import keys
from engine.remote.endpoints import Endpoint

# After the first show, when to compare the frame with the screen: the window manager
# decorates the window a moment after it is mapped.
FRAME_CHECKS_MS = (0, 250, 1000)


class MainWindow(QMainWindow):
    """Sprig's window."""

    servers_changed = Signal(list)  # the remote servers (Endpoints), after one was added, edited or removed

    def __init__(self, store: Store, settings: Settings, settings_path: Path | None = None):
        super().__init__()
        self.setWindowTitle("Sprig")
        self.setWindowIcon(app_icon())
        self.setAcceptDrops(True)
        self._framed = False  # whether the frame has been checked against the screen since the first show
        self.store = store
        self.settings_path = settings_path
        self.controller = ChatController(store, settings, self)
        self.local_server = LocalServer(self.controller, parent=self)
        self.hub = HubController(lambda: self.controller.settings, self)
        self.server_panel = ServerPanel()
        self.server_panel.hide()  # until the server is first switched on
        self._gpu = gpu_present()

        self.sidebar = ConversationList()
        self.model_bar = ModelBar()
        self.error_banner = Banner("ErrorBanner")
        self.info_banner = Banner("InfoBanner")
        self.loading_label = QLabel(objectName="LoadingLabel", visible=False)
        self.loading_label.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self._loading_name = ""
        self.chat_view = ChatView()
        self.input = MessageInput()
        self.send_button = QPushButton("Send")
        self.send_button.setObjectName("SendButton")
        self.send_button.setAccessibleName("Send or stop")
        self.input.setAccessibleName("Message")
        self.chat_view.setAccessibleName("Conversation")
        self.metrics = MetricsPanel()
        self.completion = CompletionView()

        input_row = QHBoxLayout()
        input_row.setContentsMargins(16, 8, 16, 16)
        input_row.addWidget(self.input, 1)
        input_row.addWidget(self.send_button, 0, Qt.AlignmentFlag.AlignBottom)
        center = QWidget()
        center_layout = QVBoxLayout(center)
        center_layout.setContentsMargins(0, 0, 0, 0)
        center_layout.setSpacing(0)
        center_layout.addWidget(self.model_bar)
        center_layout.addWidget(self.error_banner)
        center_layout.addWidget(self.info_banner)
        center_layout.addWidget(self.server_panel)
        center_layout.addWidget(self.loading_label)
        self.chat_page = QWidget()
        chat_layout = QVBoxLayout(self.chat_page)
        chat_layout.setContentsMargins(0, 0, 0, 0)
        chat_layout.setSpacing(0)
        chat_layout.addWidget(self.chat_view, 1)
        chat_layout.addLayout(input_row)
        self.pages = QStackedWidget()  # the chat, or the completion view for a base model
        self.pages.addWidget(self.chat_page)
        self.pages.addWidget(self.completion)
        center_layout.addWidget(self.pages, 1)
        splitter = QSplitter()
        splitter.addWidget(self.sidebar)
        splitter.addWidget(center)
        splitter.addWidget(self.metrics)
        splitter.setStretchFactor(1, 1)
        self.sidebar.setMinimumWidth(170)
        self.metrics.setMinimumWidth(180)
        splitter.setSizes([250, 760, 250])
        splitter.setCollapsible(1, False)
        self.setCentralWidget(splitter)

        self._connect()
        self.menu_actions = build_menu_bar(self)  # not `actions`: QWidget.actions() is a method
        self.refresh_conversations()
        self._show_empty_state()
        self._set_busy(False)
        self._reopen_last_conversation()
        if not restore_geometry(self, settings.window_geometry):
            place_first_window(self)
        QGuiApplication.styleHints().colorSchemeChanged.connect(self._on_color_scheme_changed)

    def _reopen_last_conversation(self) -> None:
        """Open the conversation that was open when Sprig last closed, if it still exists."""
        last = self.controller.settings.last_conversation
        if last is not None and last in {c.id for c in self.store.conversations()}:
            self.controller.open_conversation(last)

    def showEvent(self, event: QShowEvent) -> None:
        """At the first show, check the window manager's real frame against the screen once it is known."""
        super().showEvent(event)
        if not self._framed:
            self._framed = True
            opened_at = self.size()
            for delay in FRAME_CHECKS_MS:  # unless someone has resized it meanwhile
                QTimer.singleShot(delay, self, lambda: self.size() == opened_at and fit_frame(self))

    # -- wiring --------------------------------------------------------------------

    def _connect(self) -> None:
        c, m = self.controller, self.controller.models
        self.input.submitted.connect(self.send)
        self.send_button.clicked.connect(self._send_or_stop)
        self.sidebar.new_requested.connect(self.new_conversation)
        self.sidebar.opened.connect(self._open_from_sidebar)
        self.sidebar.search_changed.connect(lambda _text: self.refresh_conversations())
        self.sidebar.rename_requested.connect(c.rename_conversation)
        self.sidebar.delete_requested.connect(c.delete_conversation)
        self.sidebar.export_requested.connect(self.export_conversation)
        self.sidebar.import_requested.connect(self.import_conversation)
        self.chat_view.edit_submitted.connect(c.edit)
        self.chat_view.regenerate_requested.connect(c.regenerate)
        self.chat_view.continue_requested.connect(c.continue_answer)
        self.chat_view.summary_requested.connect(c.new_chat_with_summary)
        self.chat_view.version_requested.connect(c.show_version)
        self.model_bar.model_button.clicked.connect(self.open_model_picker)
        self.model_bar.cancel_button.clicked.connect(c.cancel)
        self.model_bar.unload_button.clicked.connect(m.unload)
        self.model_bar.settings_button.clicked.connect(self.open_settings)
        self.model_bar.metrics_button.toggled.connect(self.metrics.setVisible)
        self.model_bar.download_button.clicked.connect(self.open_get_models)
        self.hub.progress.connect(self._on_download_progress)
        self.hub.download_finished.connect(self._on_download_finished)
        self.hub.download_stopped.connect(self._on_download_stopped)
        if pending := self.hub.pending():  # paused, or cut short by closing the app: it resumes from Get models
            self.model_bar.set_download("⏸ Paused", f"{pending[0].label}: paused; resume it in Get models")

        m.model_loading.connect(self._on_model_loading)
        m.load_progress.connect(self._on_load_progress)
        m.model_loaded.connect(self._on_model_loaded)
        m.remote_model_chosen.connect(self._on_remote_model_chosen)
        m.model_unloaded.connect(self._on_model_unloaded)
        m.backend_changed.connect(self._on_backend_changed)
        c.busy_changed.connect(self._set_busy)
        m.context_changed.connect(self.model_bar.set_context)
        c.conversations_changed.connect(self.refresh_conversations)
        c.conversation_opened.connect(self._on_conversation_opened)
        c.messages_truncated.connect(self.chat_view.truncate_from)
        c.message_added.connect(self.chat_view.append_message)
        c.answer_started.connect(self._on_answer_started)
        c.answer_text.connect(self.chat_view.update_streaming)
        c.answer_metrics.connect(self.metrics.update_metrics)
        c.answer_finished.connect(self._on_answer_finished)
        c.notice.connect(self._on_notice)
        c.quiet_notice.connect(self.chat_view.show_notice)
        c.completion_text.connect(self.completion.add_text)
        c.completion_finished.connect(self._on_completion_finished)
        self.completion.continue_requested.connect(self.complete)
        self.completion.stop_requested.connect(c.cancel)
        self.completion.chat_requested.connect(lambda: self.show_completion(False))
        self.completion.get_models_requested.connect(self.open_get_models)
        c.model_notice.connect(self.info_banner.add_text)
        c.error.connect(self.error_banner.show_text)
        self.server_panel.toggled.connect(self.local_server.set_running)
        self.local_server.running_changed.connect(self._on_server_running)
        self.local_server.served_changed.connect(lambda: self._on_server_running(self.local_server.running))
        self.server_panel.settings_requested.connect(self.open_server_settings)
        self.local_server.counts_changed.connect(self.server_panel.set_counts)
        self.local_server.error.connect(self.error_banner.show_text)

    def toggle_local_server(self) -> None:
        """Model > Local server: turn the server on or off (the panel shows while it is on)."""
        self.local_server.set_running(not self.local_server.running)

    def open_server_settings(self) -> ServerSettingsDialog:
        """The server's settings (non-modal); on OK the key goes to the keyring and a running server restarts."""
        dialog = ServerSettingsDialog(self.controller.settings, stored_key(), self)
        dialog.accepted.connect(lambda: self._apply_server_settings(dialog.settings(), dialog.key()))
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dialog.show()
        return dialog

    def _apply_server_settings(self, settings: Settings, key: str | None) -> None:
        try:
            save_key(key)
        except ServerKeyError as exc:
            self.error_banner.show_text(str(exc))
            return
        self.apply_settings(settings)
        self.local_server.restart()

    def _on_server_running(self, on: bool) -> None:
        server = self.local_server
        address = server.address + (" · reachable from this network" if server.on_network else "")
        self.server_panel.set_running(on, address, server.curl_example(masked=True), server.curl_example())
        self.server_panel.setVisible(on or self.server_panel.isVisible())
        self.menu_actions["local_server"].setChecked(on)

    # -- chatting --------------------------------------------------------------------

    def send(self, text: str) -> None:
        """Send the message box's text (Enter or the Send button)."""
        self.error_banner.hide()
        if self.controller.send(text):
            self.input.clear()

    def _send_or_stop(self) -> None:
        if self.controller.answering:
            self.controller.cancel()
        else:
            self.send(self.input.toPlainText())

    def new_conversation(self) -> None:
        """Start a fresh conversation; it is saved with its first message."""
        self.controller.open_conversation(None)
        self.input.setFocus()

    def _open_from_sidebar(self, conversation_id: int) -> None:
        """Open a clicked chat; the highlight stays on the open one if it could not be opened."""
        self.controller.open_conversation(conversation_id)
        self.refresh_conversations()

    def _on_conversation_opened(self, conversation: Conversation | None, messages: list[dict]) -> None:
        self.info_banner.hide()
        self.chat_view.set_messages(messages)
        self._show_empty_state()
        self.metrics.clear()
        self.refresh_conversations()

    def _on_answer_started(self, message: dict) -> None:
        self.chat_view.append_message(message)
        self.metrics.start_answer()

    def _on_answer_finished(self, metrics: dict, state: str) -> None:
        self.chat_view.finish_streaming(metrics, state)
        self.metrics.finish_answer(metrics)

    def complete(self, text: str) -> None:
        """The completion view's Continue: the loaded model goes on with the text."""
        self.error_banner.hide()
        if self.controller.complete(text):
            self.completion.set_running(True)
            self.metrics.start_answer()

    def _on_completion_finished(self, metrics: dict, _state: str) -> None:
        self.completion.set_running(False)
        self.metrics.finish_answer(metrics)

    def show_completion(self, on: bool) -> None:
        """Show the completion view (a local model continues text) or the chat (View → Completion view)."""
        on = on and self.controller.loaded is not None and self.controller.chat_engine is not None
        self.pages.setCurrentWidget(self.completion if on else self.chat_page)
        self.menu_actions["completion"].setChecked(on)

    def _on_notice(self, text: str) -> None:
        self.info_banner.show_text(text)
        self.chat_view.show_notice(text)

    def _set_busy(self, busy: bool) -> None:
        answering = busy and self.controller.answering
        self.send_button.setText("Stop" if answering else "Send")
        self.send_button.setProperty("stop", answering)
        self.send_button.style().unpolish(self.send_button)
        self.send_button.style().polish(self.send_button)
        self.send_button.setEnabled(answering or not busy)
        self.model_bar.model_button.setEnabled(not busy)
        self.model_bar.unload_button.setEnabled(not busy and self.controller.loaded is not None)

    def loading_text(self) -> str:
        """What the centre says while a model loads: which one, and the bar's progress."""
        bar = self.model_bar.progress
        percent = round(100 * (bar.value() - bar.minimum()) / max(bar.maximum() - bar.minimum(), 1))
        stage = bar.format().replace("%p%", "").strip()
        return f"Loading {self._loading_name}…\n{stage}: {percent}%"

    def _show_empty_state(self) -> None:
        """The centre's text while the chat is empty, or the loading line above a chat."""
        info = self.controller.model_info
        loading = self.model_bar.progress.isVisible()
        self.loading_label.setVisible(loading and self.chat_view.has_messages())
        if loading:
            text = self.loading_text()
            self.loading_label.setText(text.replace("\n", " — "))
        elif info is None:
            text = (
                "No model loaded.\nChoose one with the model button above, get one from Hugging Face "
                "(Model → Get models…), or drop a .gguf file here."
            )
        else:
            text = f"{info.name} is ready.\nType a message to start."
        self.chat_view.set_placeholder(text)

    # -- conversations ---------------------------------------------------------------

    def refresh_conversations(self) -> None:
        """Re-read the sidebar from the store, with the current search; title the window."""
        needle = self.sidebar.search.text().strip()
        conversations = self.store.conversations(needle)
        snippets = {c.id: self.store.snippet(c.id, needle) for c in conversations} if needle else {}
        current = self.controller.conversation
        self.sidebar.set_conversations(conversations, current.id if current else None, snippets)
        title = self.store.conversation(current.id).title if current else ""
        self.setWindowTitle(f"{title} — Sprig" if title else "Sprig")

    def export_conversation(self, conversation_id: int, fmt: str) -> None:
        """Save a conversation as Markdown or JSON where the user chooses."""
        conversation = self.store.conversation(conversation_id)
        messages = self.store.messages(conversation_id)
        suffix, kind = (".md", "Markdown (*.md)") if fmt == "markdown" else (".json", "JSON (*.json)")
        safe_title = "".join(ch if ch.isalnum() or ch in " -_" else "_" for ch in conversation.title).strip()
        path, _ = QFileDialog.getSaveFileName(self, "Export chat", (safe_title or "chat") + suffix, kind)
        if not path:
            return
        text = (
            to_markdown(conversation, messages)
            if fmt == "markdown"
            else json.dumps(to_json(conversation, messages), ensure_ascii=False, indent=2)
        )
        try:
            Path(path).write_text(text, encoding="utf-8")
        except OSError as exc:
            self.error_banner.show_text(f"Could not write {path}: {exc.strerror}.")

    def import_conversation(self) -> None:
        """Import a conversation exported as JSON."""
        path, _ = QFileDialog.getOpenFileName(self, "Import chat", "", "JSON (*.json);;All files (*)")
        if not path:
            return
        try:
            conversation = import_json(self.store, read_json_file(path))
        except TranscriptError as exc:
            self.error_banner.show_text(str(exc))
            return
        self.error_banner.hide()  # an earlier failed import is no longer the news
        self.controller.open_conversation(conversation.id)

    # -- models ------------------------------------------------------------------------

    def library(self) -> list[LibraryEntry]:
        """The library entries: bundled, models folder, added before, downloaded from Hugging Face."""
        added = [(m.path, m.name) for m in self.store.models()]
        downloaded = [(str(m.path), m.name) for m in cached_models(self.hub.hub().cache_dir)]
        return library_entries(Path(self.controller.settings.models_folder), added + downloaded)

    def open_model_picker(self) -> ModelPicker:
        """Show the model picker (non-modal); returns it."""
        current = self.controller.loaded.path if self.controller.loaded else None
        settings = self.controller.settings
        loaded = self.controller.loaded
        picker = ModelPicker(
            self.library(),
            self.controller.headers,
            settings.context_length,
            Path(settings.models_folder),
            current,
            self,
            backend=planned_backend(settings.backend),
            draft_target=vocabulary_metadata(loaded.file.metadata) if loaded else None,
            downloads={m.path: m for m in cached_models(self.hub.hub().cache_dir)},
        )
        picker.load_requested.connect(self.controller.models.load)
        picker.add_requested.connect(self.add_model)
        picker.remove_requested.connect(self.store.remove_model)
        picker.delete_download_requested.connect(self.delete_download)
        picker.get_models_requested.connect(self.open_get_models)
        picker.settings_requested.connect(self.open_model_settings)
        remote = RemoteModels(self.store.endpoints(), picker)
        remote.chosen.connect(self.controller.models.use_remote)
        remote.add_requested.connect(self.add_server)
        self.servers_changed.connect(remote.set_endpoints)  # added, edited or removed: its models follow
        layout = picker.layout()
        assert layout is not None  # the picker lays itself out
        layout.addWidget(remote)  # each server's models, in a group of their own, under the files
        picker.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        picker.show()
        return picker

    def open_model_settings(self, path: str = "", name: str = "") -> ModelSettingsDialog | None:
        """Model settings… for the model file at `path` (default: the loaded one); returns the dialog (non-modal)."""
        loaded = self.controller.loaded
        if not path and loaded is None:
            self.error_banner.show_text("No model is loaded. Choose one in the model picker to change its settings.")
            return None
        file = Path(path) if path else loaded.path if loaded else Path()
        if not name:
            info = self.controller.model_info
            name = info.name if info and info.path == file else file.stem
        dialog = ModelSettingsDialog(
            LibraryEntry(file, name),
            self.store.model_settings(file),
            self.controller.settings,
            self.library(),
            self.controller.headers,
            self,
        )
        dialog.accepted.connect(lambda: self._keep_model_settings(file, dialog.model_settings()))
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dialog.show()
        return dialog

    def _keep_model_settings(self, path: Path, model_settings: ModelSettings) -> None:
        try:
            self.controller.models.set_model_settings(path, model_settings)
        except StorageError as exc:
            self.error_banner.show_text(str(exc))

    def open_get_models(self) -> GetModelsView:
        """Show the Get models view (non-modal): find, download and load models from Hugging Face."""
        settings = self.controller.settings
        view = GetModelsView(self.hub, settings.context_length, planned_backend(settings.backend), self)
        view.load_requested.connect(self.controller.models.load)
        view.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        view.show()
        return view

    def delete_download(self, path: str) -> None:
        """Delete a model downloaded from Hugging Face (the picker asked and confirmed)."""
        cache = self.hub.hub().cache_dir
        model = find_cached(cache, Path(path))
        if model is None:
            return
        try:
            delete_download(cache, model)
        except OSError as exc:
            self.error_banner.show_text(f"Could not delete {model.path}: {exc.strerror}.")
            return
        self.store.remove_model(path)

    def _on_download_progress(self, progress: Progress) -> None:
        percent = 100 * progress.done // max(progress.total, 1)
        self.model_bar.set_download(f"↓ {percent}%", f"Downloading {progress.pull.label}: {progress_text(progress)}")

    def _on_download_finished(self, progress: Progress) -> None:
        label = progress.pull.label
        self.model_bar.set_download("✓ Downloaded", f"{label} is downloaded and verified: open Get models to load it")
        self.info_banner.show_text(f"{label} is downloaded and verified. Load it from Get models or the model picker.")

    def _on_download_stopped(self, pull: Pull, error: object) -> None:
        paused = error is None and pull in self.hub.pending()
        self.model_bar.set_download("⏸ Paused" if paused else None, f"{pull.label}: paused; resume it in Get models")
        if error is not None:
            self.error_banner.show_text(str(error))

    def open_from_launch(self, model: str) -> None:
        """Another `sprig` was started on these chats: come to the front, load its model if any."""
        self.setWindowState(self.windowState() & ~Qt.WindowState.WindowMinimized)
        self.show()
        self.raise_()
        self.activateWindow()
        if model:
            self.add_model(model)

    def add_model(self, path: str) -> None:
        """Add a model file to the library and load it (file dialog, drop, command line)."""
        file = Path(path)
        if file.suffix.lower() != ".gguf":
            self.error_banner.show_text(f"{file.name} is not a GGUF model file (.gguf); Sprig cannot open it.")
            return
        if not file.is_file():
            self.error_banner.show_text(f"{file} does not exist: it may have been moved or deleted.")
            return
        self.error_banner.hide()
        known = {entry.path.resolve(): entry.name for entry in self.library() if entry.path.exists()}
        self.controller.models.load(file, known.get(file.resolve()))

    def _on_model_loading(self, name: str) -> None:
        self.info_banner.hide()  # what it said was about the model before
        self.error_banner.hide()  # a new load is under way: an earlier failure is no longer the news
        self._loading_name = name
        self.model_bar.set_loading(True)
        self.model_bar.set_model_text(f"Loading {name}…", f"Loading {name}")
        self._show_empty_state()

    def _on_load_progress(self, fraction: float, stage: str) -> None:
        self.model_bar.progress.setValue(int(fraction * 1000))
        self.model_bar.progress.setFormat(f"{stage} %p%")
        self._show_empty_state()

    def _on_backend_changed(self, name: str, device: str, reasons: list[str]) -> None:
        status = backend_status(name, device, reasons, self._gpu)
        self.model_bar.set_backend(status)
        self.metrics.set_backend(status)

    def _on_model_loaded(self, info: ModelInfo) -> None:
        if self.model_bar.model_path != info.path:  # another model: the last answer's figures are not its own
            self.metrics.clear()
        self.model_bar.set_loading(False)
        self.model_bar.set_model(info)
        self._save_settings()
        self._show_empty_state()
        self.completion.set_model_name(info.name)
        self.show_completion(info.base_model)  # a base model continues text; Chat anyway opens the chat

    def _on_remote_model_chosen(self, description) -> None:
        """A model on a server answers now: name it and its server in the model bar."""
        self.show_completion(False)
        self.metrics.clear()
        self.model_bar.set_model_text(
            f"{description.name} — {description.where}", f"{description.uri}\nChoose, add or remove models (Ctrl+L)"
        )
        self._show_empty_state()

    def _on_model_unloaded(self) -> None:
        self.show_completion(False)
        self.model_bar.set_loading(False)
        self.model_bar.set_model(None)
        self._on_backend_changed("none", "no model loaded", [])
        self._show_empty_state()

    # -- settings ------------------------------------------------------------------------

    def open_settings(self) -> None:
        """The settings dialog; changes apply at once and are saved. Servers are added, edited and removed
        as the dialog's list asks, at once."""
        reasons = list(self.controller.loaded.backend_notes) if self.controller.loaded else []
        dialog = SettingsDialog(self.controller.settings, reasons, self, self.store.endpoints())
        self.servers_changed.connect(dialog.servers.set_endpoints)
        dialog.servers.add_requested.connect(self.add_server)
        dialog.servers.edit_requested.connect(self.edit_server)
        dialog.servers.remove_requested.connect(self.remove_server)
        if dialog.exec():
            self.apply_settings(dialog.settings())

    def add_server(self) -> bool:
        """Settings → Models → Add a server: keep the server (its key in the keyring); True if one was added."""
        return self._keep_server(AddServerDialog(self))

    def edit_server(self, endpoint: Endpoint) -> bool:
        """Settings → Models → Edit…: change a server's name, address, key or certificate choice; True if changed.

        Its chats follow a new address; if its model answers now, it answers from the server as edited.
        """
        return self._keep_server(AddServerDialog(self, endpoint, keys.api_key(endpoint.base_url)), endpoint)

    def _keep_server(self, dialog: AddServerDialog, editing: Endpoint | None = None) -> bool:
        if not dialog.exec():
            return False
        endpoint = dialog.endpoint()
        try:
            keys.save_api_key(endpoint.base_url, dialog.api_key())
            self.store.save_endpoint(endpoint, editing)
            if editing is not None and editing.base_url != endpoint.base_url:
                keys.save_api_key(editing.base_url, None)  # the key now lives under the new address
        except (SprigError, ValueError) as exc:
            self.error_banner.show_text(str(exc))
            return False
        if editing is not None:
            self.controller.models.server_changed(editing, endpoint)
        self.servers_changed.emit(self.store.endpoints())
        return True

    def remove_server(self, endpoint: Endpoint) -> bool:
        """Settings → Models → Remove: forget a server, delete its key from the keyring; True if removed.

        Its models leave the picker; its chats stay, and say their server is gone when continued.
        """
        buttons = QMessageBox.StandardButton.Yes | QMessageBox.StandardButton.No
        question = (
            f"Remove “{endpoint.name}” ({endpoint.base_url})? Its API key is deleted from the keyring. "
            "Chats with its models stay, to read."
        )
        box = QMessageBox(QMessageBox.Icon.Question, "Remove the server", question, buttons, self)
        if box.exec() != QMessageBox.StandardButton.Yes:
            return False
        try:
            keys.save_api_key(endpoint.base_url, None)
        except SprigError as exc:
            self.error_banner.show_text(str(exc))
            return False
        self.store.remove_endpoint(endpoint.name)
        self.controller.models.server_changed(endpoint, None)
        self.servers_changed.emit(self.store.endpoints())
        return True

    def apply_settings(self, settings: Settings) -> None:
        """Use and save `settings`: theme and text size now, engine changes through the controller."""
        self.controller.apply_settings(settings)
        self.apply_look()
        self._save_settings()

    def apply_look(self) -> None:
        """Apply the settings' theme (the desktop's scheme for "system") and text size."""
        app = QApplication.instance()
        assert isinstance(app, QApplication)  # the window exists only inside one
        settings = self.controller.settings
        look = apply_theme(app, settings.theme, settings.text_scale)
        self.chat_view.set_dark(look == "dark")

    def _on_color_scheme_changed(self, _scheme: Qt.ColorScheme) -> None:
        """The desktop went light or dark: follow it if the theme is "system"."""
        if self.controller.settings.theme == "system":
            self.apply_look()

    def change_text_size(self, step: int) -> None:
        """Make the text `step` percent larger (negative: smaller); 0 goes back to 100%."""
        low, high = RANGES["text_scale"]
        scale = 100 if step == 0 else min(max(self.controller.settings.text_scale + step, low), high)
        self.apply_settings(replace(self.controller.settings, text_scale=int(scale)))

    def open_conversation_settings(self) -> None:
        """Sampling overrides for the open conversation."""
        conversation = self.controller.conversation
        overrides = conversation.overrides if conversation else {}
        dialog = ConversationSettingsDialog(self.controller.settings, overrides, self)
        if dialog.exec():
            self.controller.set_overrides(dialog.overrides())

    def open_adapters(self) -> None:
        """The LoRA adapters of the open conversation, among those listed under the loaded model."""
        info = self.controller.model_info
        if info is None or self.controller.loaded is None:
            self.error_banner.show_text("Load a model first: adapters are listed under the model they fit.")
            return
        folder = Path(self.controller.settings.models_folder)
        listed = adapters_for(info.architecture, [info.name, info.path.stem], find_adapters(folder))
        conversation = self.controller.conversation
        overrides = conversation.overrides if conversation else {}
        dialog = AdaptersDialog(info.name, listed, conversation_adapters(overrides), folder, self)
        if dialog.exec():
            self.controller.set_overrides(with_adapters(overrides, dialog.chosen()))

    def _save_settings(self) -> None:
        try:
            save_settings(self.controller.settings, self.settings_path)
        except OSError as exc:
            self.error_banner.show_text(f"Could not save the settings: {exc}.")

    # -- drag and drop, closing ------------------------------------------------------------

    def dragEnterEvent(self, event: QDragEnterEvent) -> None:
        """Accept dragged files (the drop says whether they are models)."""
        if event.mimeData().hasUrls():
            event.acceptProposedAction()

    def dropEvent(self, event: QDropEvent) -> None:
        """Add a dropped .gguf file to the library and load it; explain anything else."""
        files = [url.toLocalFile() for url in event.mimeData().urls() if url.isLocalFile()]
        if not files:
            self.error_banner.show_text("Only files on this computer can be dropped here.")
            return
        event.acceptProposedAction()
        self.add_model(files[0])

    def closeEvent(self, event: QCloseEvent) -> None:
        """Stop the server and the engine, keep what streamed, save the settings. The window goes first:
        saving the open conversation's state (seconds, for a long one on a big model) happens out of sight."""
        self.controller.settings = replace(self.controller.settings, window_geometry=saved_geometry(self))
        self.hide()
        self.local_server.set_running(False)
        self.hub.stop()  # a download pauses; it resumes at the next start
        self.controller.shutdown()
        self._save_settings()
        super().closeEvent(event)
