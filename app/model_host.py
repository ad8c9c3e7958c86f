"""The model host: the one model the chat answers with, through its whole life.

It loads, unloads and switches local model files, and chooses models on remote servers,
both through the engine's one opening call (`engine.opening.open_model`: validation, the
memory verdict, the backend, the template, the draft model and speculation), and shows what
it returns; either way the chat sees a `ChatEngine` (`chat_engine`). Loads run as jobs on the engine
thread (the `JobRunner` the chat controller shares), with progress and cancel. A load
keeps the previous model until the new one is ready, where memory holds both; otherwise
the previous one goes first, and a failed load says plainly that it went. A released
model's memory goes back to the system, after the conversation its session holds is saved
(`save_state`: a switch, an unload or closing keeps it as leaving the conversation does).
Each model file's own settings (`ModelSettings`) are read at load; a change to them or to
the app's settings reloads or rebuilds the session when the engine thread is next free.

No widgets here: the window connects these signals to its widgets.
"""

import threading
from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import QObject, Qt, Signal

from app.memory_release import release_freed_memory
from app.model_settings import ModelSettings, open_settings, with_model_settings
from app.settings import Settings
from app.storage import Store
from app.worker import Handlers, Job, JobRunner
from backends.kv_types import DEFAULT_KV_TYPE
from engine.chat_engine import ChatEngine, LocalChatEngine, ModelDescription
from engine.chat_session import ChatSession
from engine.loader import LoadedModel
from engine.model_info import ModelInfo
from engine.model_uri import local_uri
from engine.opening import OpenedModel, OpenSettings, RemoteModel, open_model
from engine.remote import keys
from engine.remote.client import RemoteChat
from engine.remote.endpoints import Endpoint
from engine.server.scheduler import Scheduler

BuildKey = tuple[str, int, int, str | None, str | None, str]  # see ModelHost._build_key
BUSY = "Wait for the current answer or load to finish, or stop it first."


class ModelHost(QObject):
    """Holds the chat's model (a loaded file or a server's model) and runs its life cycle."""

    model_loading = Signal(str)  # model file name
    load_progress = Signal(float, str)  # fraction, stage
    model_loaded = Signal(object)  # ModelInfo; re-emitted when a failed load left the model in place
    model_unloaded = Signal()
    remote_model_chosen = Signal(object)  # ModelDescription of a model on a remote server, now answering
    backend_changed = Signal(str, str, list)  # backend name, device, reasons others were passed over
    context_changed = Signal(int)  # the chat's context size in tokens, for a new model or context setting
    model_notice = Signal(str)  # something to know about the model being loaded (slow, guessed template)
    error = Signal(str)  # a load failed or could not start; the engine's message, intact

    # Emitted on the engine thread and re-emitted on the GUI thread, so that the public
    # signals above are only ever emitted on the GUI thread, whatever is connected to them.
    _engine_progress = Signal(float, str)
    _engine_notice = Signal(str)

    def __init__(
        self,
        jobs: JobRunner,
        store: Store,
        settings: Callable[[], Settings],
        parent: QObject | None = None,
        save_state: Callable[[ChatSession], None] = lambda session: None,
    ):
        super().__init__(parent)
        self.jobs, self.store, self._settings = jobs, store, settings
        self._save_state = save_state  # keeps the conversation a session holds, before the session goes
        self._engine_progress.connect(self.load_progress, Qt.ConnectionType.QueuedConnection)
        self._engine_notice.connect(self.model_notice, Qt.ConnectionType.QueuedConnection)
        jobs.idle.connect(self.apply_settings)  # a backend or context change made while busy
        self.opened: OpenedModel | None = None  # the local model, as `open_model` opened it
        self.session: ChatSession | None = None
        self.remote: RemoteChat | None = None  # a model on a server, chosen in place of a local one
        # Owns the loaded model's turns: the chat's answers (first) and the local server's requests.
        self.scheduler: Scheduler | None = None
        self.model_settings = ModelSettings()  # the loaded model's own settings (Model settings…)
        # (backend, threads, context, template, draft) of the last load or session, and of the load under way
        self._built_for: BuildKey | None = None
        self._loading_for: BuildKey | None = None
        # (previous model, model loading) when the previous one had to go before the new one loaded
        self._unloaded_for: tuple[str, str] | None = None

    # -- state -------------------------------------------------------------------

    @property
    def loaded(self) -> LoadedModel | None:
        """The loaded local model file, or None."""
        return self.opened.loaded if self.opened is not None else None

    @property
    def info(self) -> ModelInfo | None:
        """What the loaded file's header says (name, size, quantization...), or None."""
        return self.opened.info if self.opened is not None else None

    @property
    def draft(self) -> LoadedModel | None:
        """The loaded model's draft model, if it has one."""
        return self.opened.draft if self.opened is not None else None

    @property
    def effective_settings(self) -> Settings:
        """The app's settings with the loaded model's own over them (a conversation's go over both)."""
        return with_model_settings(self._settings(), self.model_settings, self.draft is not None)

    @property
    def chat_engine(self) -> ChatEngine | None:
        """What answers now: the chosen remote model, else the loaded local one, else None."""
        if self.remote is not None:
            return self.remote
        if self.session is None or self.scheduler is None:
            return None
        name = self.info.name if self.info else self.session.loaded.path.name
        uri = local_uri(self.session.loaded.path)
        return LocalChatEngine(
            self.session, self.scheduler, ModelDescription(uri, name, "local", self.session.cache.n_ctx)
        )

    # -- remote models ---------------------------------------------------------------

    def use_remote(self, endpoint: Endpoint, model_id: str) -> bool:
        """Answer with `model_id` on `endpoint` from now on (its API key from the keyring); False if busy.

        A loaded local model is let go (on the engine thread), its memory given back.
        """
        if self.jobs.busy:
            self.error.emit(BUSY)
            return False
        self._drop_remote()
        self.remote = self._open_remote(endpoint, model_id)
        if self.loaded is not None:
            self.jobs.start(
                Job(lambda cancel: self._release_model(), "unload"), Handlers(self._forget_local, self.error.emit)
            )
        self.remote_model_chosen.emit(self.remote.describe())
        return True

    def server_changed(self, old: Endpoint, new: Endpoint | None) -> None:
        """The server `old` was edited into `new`, or removed (None): a model of it that answers now
        answers from the server as edited, or no longer."""
        if self.remote is None or self.remote.endpoint != old:
            return
        model_id = self.remote.model
        self._drop_remote()
        if new is None:
            self.model_unloaded.emit()
            return
        self.remote = self._open_remote(new, model_id)
        self.remote_model_chosen.emit(self.remote.describe())

    @staticmethod
    def _open_remote(endpoint: Endpoint, model_id: str) -> RemoteChat:
        """Model `model_id` on `endpoint`, its API key from the keyring (no request is made yet)."""
        opened = open_model(RemoteModel(endpoint, model_id), OpenSettings(api_key=keys.api_key(endpoint.base_url)))
        assert opened.remote is not None  # a remote source opens as a remote model
        return opened.remote

    def _drop_remote(self) -> None:
        if self.remote is not None:
            self.remote.close()
            self.remote = None

    # -- local models ------------------------------------------------------------------

    def load(self, path: str | Path, name: str | None = None) -> bool:
        """Load a model file on the engine thread; False if something else is running."""
        if self.jobs.busy:
            self.error.emit(BUSY)
            return False
        path = Path(path)
        model_settings = self.store.model_settings(path)
        settings = with_model_settings(self._settings(), model_settings, model_settings.draft_model is not None)
        self._loading_for = self._build_key(settings, model_settings)
        self._drop_remote()  # a local model chosen: the remote one steps aside
        self._unloaded_for = None
        self.model_loading.emit(path.name)

        reclaimable = self.opened.memory.needed if self.opened is not None and self.opened.memory else 0

        def make_room(info: ModelInfo) -> None:
            """Engine thread: both do not fit, so the current model goes before `info`'s loads."""
            if self.loaded is not None:
                self._unloaded_for = (self.info.name if self.info else self.loaded.path.name, info.name)
                self._release_model()

        def run(cancel: threading.Event) -> tuple[OpenedModel, ChatSession, ModelSettings]:
            # The file is validated and its memory planned before the current model goes, so a bad or
            # oversized file leaves the chat as it was (engine.opening).
            opened = open_model(
                path,
                open_settings(settings, model_settings, name),
                progress=self._engine_progress.emit,
                cancel=cancel,
                on_note=self._engine_notice.emit,
                reclaimable=reclaimable,
                make_room=make_room,
            )
            try:
                session = opened.new_session(settings.context_length, settings.max_tokens)
            except BaseException:
                opened.close()
                raise
            self._release_model()  # the previous model, kept while the new one loaded
            return opened, session, model_settings

        job = Job(run, "load")
        self.jobs.start(job, Handlers(self._finish_load, lambda message: self._load_failed(job, message)))
        return True

    def unload(self) -> None:
        """Release the loaded model (on the engine thread, after any running job), or forget the remote one."""
        if self.jobs.busy:
            return
        if self.remote is not None and self.loaded is None:
            self._drop_remote()
            self.model_unloaded.emit()
            return
        self.jobs.start(Job(lambda cancel: self._release_model(), "unload"), Handlers(self._unloaded, self.error.emit))

    def set_model_settings(self, path: str | Path, model_settings: ModelSettings) -> None:
        """Keep a model file's own settings; for the loaded model they apply as `apply_settings` says."""
        self.store.set_model_settings(path, model_settings)
        if self.loaded is not None and Path(path) == self.loaded.path:
            self.model_settings = model_settings
            self.apply_settings()

    def apply_settings(self) -> None:
        """Follow the settings: reload for a new backend, thread count, template or draft model; rebuild
        the session for a new context. While the engine thread is busy this waits until it is free."""
        settings = with_model_settings(
            self._settings(), self.model_settings, self.model_settings.draft_model is not None
        )
        if self.loaded is None or self.jobs.busy or self._built_for is None:
            return
        built = self._built_for
        wanted = self._build_key(settings, self.model_settings)
        if wanted[:2] + wanted[3:] != built[:2] + built[3:]:
            self.load(self.loaded.path, self.info.name if self.info else None)
        elif wanted != built:
            opened = self.opened
            assert opened is not None  # a model is loaded
            self._built_for = wanted
            job = Job(
                lambda cancel: opened.new_session(settings.context_length, settings.max_tokens, settings.speculative),
                "session",
            )
            self.jobs.start(job, Handlers(self._session_built, self.error.emit))

    def close(self) -> None:
        """When the app closes (the engine thread stopped): end the server's turns and release the model."""
        self._drop_remote()
        self._release_model()

    @staticmethod
    def _build_key(settings: Settings, model_settings: ModelSettings) -> BuildKey:
        """What a load or session was built with: a change in the first two, the template, the draft or the
        KV type reloads."""
        draft = model_settings.draft_model if settings.speculative != "off" else None
        kv_type = model_settings.kv_type or DEFAULT_KV_TYPE
        return settings.backend, settings.cpu_threads, settings.context_length, model_settings.template, draft, kv_type

    def _release_model(self) -> None:
        """Engine thread: stop the scheduler (ending any server request), save the conversation the session
        holds and drop the session, close the model, and give the memory back to the system."""
        if self.session is not None:
            self._save_state(self.session)
        self.session = None
        if self.scheduler is not None:
            self.scheduler.close()
            self.scheduler = None
        if self.opened is not None:
            self.opened.close()
            self.opened = None
            release_freed_memory()

    # -- job results (GUI thread) -----------------------------------------------------------

    def _load_failed(self, job: Job, message: str) -> None:
        if job.cancel.is_set():  # the user asked for it: news, not an error
            self.model_notice.emit(message)
        else:
            self.error.emit(message)

    def _finish_load(self, result: object) -> None:
        if not isinstance(result, tuple):  # failed or cancelled
            if self.loaded is not None:  # the current model is still there
                self.model_loaded.emit(self.info)
                return
            self._forget_local()
            self.model_unloaded.emit()
            if self._unloaded_for is not None:
                previous, wanted = self._unloaded_for
                self.model_notice.emit(
                    f"{previous} was unloaded to make room for {wanted}, which did not load, so no model is "
                    "loaded now. Choose one with the model button."
                )
            return
        self.opened, self.session, self.model_settings = result
        assert self.loaded is not None and self.info is not None  # a local model was opened
        self._built_for = self._loading_for
        self.scheduler = Scheduler()
        self.store.add_model(str(self.loaded.path), self.info.name)
        self.store.touch_model(str(self.loaded.path))
        backend = self.loaded.backend
        self.backend_changed.emit(backend.name, backend.device_name, self.opened.backend_reasons)
        self.model_loaded.emit(self.info)
        self.context_changed.emit(self.session.cache.n_ctx)

    def _forget_local(self, _result: object = None) -> None:
        """The local model is gone: so are what was known about it and its settings."""
        self.session, self.model_settings = None, ModelSettings()

    def _unloaded(self, _result: object) -> None:
        self._forget_local()
        self.model_unloaded.emit()

    def _session_built(self, result: object) -> None:
        if isinstance(result, ChatSession):
            self.session = result
            self.context_changed.emit(result.cache.n_ctx)
