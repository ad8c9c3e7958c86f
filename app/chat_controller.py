"""The chat controller: the one place where the GUI meets the engine and the store.

It lives on the GUI thread. Slow work (loading a model, answering) runs as jobs on the
engine thread; their results come back as queued signals. The store is the source of
truth for conversations: before each answer the controller hands the engine the stored
history, and the `ChatSession` reuses whatever prefix of it the KV cache already holds,
so a new turn prefills only its new tokens and an edit or regenerate rewinds the cache
to where the conversation diverged. Answers are saved while they stream.

No widgets here: the window connects these signals to its widgets.
"""

import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

from PySide6.QtCore import QObject, Qt, Signal

from app.adapter_library import conversation_adapters
from app.header_reader import HeaderReader
from app.memory_release import release_freed_memory
from app.model_library import ModelInfo, available_memory, describe_model
from app.model_settings import ModelSettings, load_draft, template_override, with_model_settings
from app.settings import Settings, effective_sampling, sampling_params
from app.storage import Conversation, Message, MessageState, Store, ThrottledSaver, ended_early
from app.worker import EngineThread, Job
from backends.selection import planned_backend
from engine.chat_engine import ChatEngine, LocalChatEngine, ModelDescription
from engine.chat_session import ChatSession
from engine.errors import ContextFullError, SprigError
from engine.generation import FINISH_CANCELLED, GenerationEvent
from engine.gguf_file import open_gguf
from engine.loader import LoadedModel, load_model
from engine.model_uri import local_uri
from engine.remote import keys
from engine.remote.client import RemoteChat
from engine.remote.endpoints import Endpoint
from engine.server.scheduler import Scheduler
from engine.speculation import Speculation

TITLE_LENGTH = 48
SUMMARY_REQUEST = (
    "Summarize our conversation so far in a short paragraph: the questions, the answers and "
    "anything still open. Write only the summary."
)
SUMMARY_TOKENS = 256  # the most a summary may take (an eighth of the context, in small contexts)


BuildKey = tuple[str, int, int, str | None, str | None]  # see ChatController._build_key


class OutOfMemory(SprigError):
    """The model would not fit in the memory available."""


def title_from(text: str) -> str:
    """A conversation title from its first message: the first line, shortened."""
    line = text.strip().splitlines()[0] if text.strip() else "New chat"
    return line if len(line) <= TITLE_LENGTH else line[: TITLE_LENGTH - 1].rstrip() + "…"


NO_ROOM_TO_CONTINUE = (
    "There is no room to continue this answer: the question and the answer so far fill the context even "
    "without the older turns. Start a new chat with a summary, or raise the context length (Settings, Chat)."
)


def explain_no_room(events: Iterator[GenerationEvent]) -> Iterator[GenerationEvent]:
    """A continuation's events, with a full context explained in a continuation's terms."""
    try:
        yield from events
    except ContextFullError as exc:
        raise ContextFullError(NO_ROOM_TO_CONTINUE) from exc


def load_notes_text(model_name: str, notes: list[str]) -> str:
    """What the backend changed at load, as one headline line and one line per note below it."""
    if len(notes) == 1:
        return f"{model_name}: {notes[0]}."
    headline = f"{model_name}: {len(notes)} tensors were converted at load, so loading takes longer."
    return "\n".join([headline, *(f"• {note}" for note in notes)])


def message_dict(message: Message) -> dict:
    """A stored message as the chat view takes it."""
    return {
        "position": message.position,
        "role": message.role,
        "content": message.content,
        "model": message.model,
        "metrics": message.metrics,
        "state": message.state,
        "versions": len(message.versions) + 1,
        "active": message.active,
    }


class ChatController(QObject):
    """Loads models, runs answers, and keeps the store up to date."""

    model_loading = Signal(str)  # model file name
    load_progress = Signal(float, str)  # fraction, stage
    model_loaded = Signal(object)  # ModelInfo; re-emitted when a failed load left the model in place
    model_unloaded = Signal()
    remote_model_chosen = Signal(object)  # ModelDescription of a model on a remote server, now answering
    backend_changed = Signal(str, str, list)  # backend name, device, reasons others were passed over
    busy_changed = Signal(bool)  # an answer is being generated
    context_changed = Signal(int)  # the chat's context size in tokens, for a new model or context setting
    conversations_changed = Signal()
    conversation_opened = Signal(object, list)  # Conversation, [message dicts]
    messages_truncated = Signal(int)  # messages at and after this position were removed
    message_added = Signal(dict)  # a stored user message
    answer_started = Signal(dict)  # the assistant message dict, empty content
    answer_text = Signal(str)  # the whole answer so far
    answer_metrics = Signal(dict)  # Metrics.as_dict() of the answer so far
    answer_finished = Signal(dict, str)  # final metrics, state
    notice = Signal(str)  # something the user should know about the chat (dropped turns)
    model_notice = Signal(str)  # something to know about the model being loaded (slow, guessed template)
    error = Signal(str)  # something went wrong; the engine's message, intact

    # Emitted on the engine thread and re-emitted on the GUI thread, so that the public
    # signals above are only ever emitted on the GUI thread, whatever is connected to them.
    _engine_progress = Signal(float, str)
    _engine_notice = Signal(str)

    def __init__(self, store: Store, settings: Settings, parent: QObject | None = None):
        super().__init__(parent)
        self.store = store
        self.settings = settings
        self.engine = EngineThread()
        self.headers = HeaderReader(self)  # the model picker's, on a thread of its own
        self.engine.worker.yielded.connect(self._on_yielded)
        self.engine.worker.errored.connect(self._on_errored)
        self.engine.worker.finished.connect(self._on_finished)
        self._engine_progress.connect(self.load_progress, Qt.ConnectionType.QueuedConnection)
        self._engine_notice.connect(self.model_notice, Qt.ConnectionType.QueuedConnection)
        self.loaded: LoadedModel | None = None
        self.model_info: ModelInfo | None = None
        self.conversation: Conversation | None = None
        self._session: ChatSession | None = None
        self.remote: RemoteChat | None = None  # a remote model chosen in place of the local one
        # Owns the loaded model's turns: the chat's answers (first) and the local server's requests.
        self.scheduler: Scheduler | None = None
        self._job: Job | None = None
        self._answer: dict | None = None  # the streaming answer: message id, text, metrics, saver
        # (backend, threads, context, template, draft) of the last load or session
        self._built_for: BuildKey | None = None
        self._loading_for: BuildKey | None = None  # the same, of the load under way
        self.model_settings = ModelSettings()  # the loaded model's own settings (Model settings…)
        self._draft: LoadedModel | None = None  # the loaded model's draft model, if it has one
        self._told_overflow: set[int] = set()  # conversations already told that old turns were left out
        self._summary_of: Conversation | None = None  # the chat being summarized for a new one
        # (previous model, model loading) when the previous one had to go before the new one loaded
        self._unloaded_for: tuple[str, str] | None = None

    # -- state -------------------------------------------------------------------

    @property
    def busy(self) -> bool:
        """True while a job (loading or answering) runs on the engine thread."""
        return self._job is not None

    @property
    def answering(self) -> bool:
        """True while an answer is being generated."""
        return self._job is not None and self._job.kind == "answer"

    @property
    def loading(self) -> bool:
        """True while a model is loading."""
        return self._job is not None and self._job.kind == "load"

    @property
    def effective_settings(self) -> Settings:
        """The app's settings with the loaded model's own over them (a conversation's go over both)."""
        return with_model_settings(self.settings, self.model_settings, self._draft is not None)

    @property
    def chat_engine(self) -> ChatEngine | None:
        """What answers now: the chosen remote model, else the loaded local one, else None."""
        if self.remote is not None:
            return self.remote
        if self._session is None or self.scheduler is None:
            return None
        name = self.model_info.name if self.model_info else self._session.loaded.path.name
        uri = local_uri(self._session.loaded.path)
        return LocalChatEngine(
            self._session, self.scheduler, ModelDescription(uri, name, "local", self._session.cache.n_ctx)
        )

    def use_remote(self, endpoint: Endpoint, model_id: str) -> bool:
        """Answer with `model_id` on `endpoint` from now on (its API key from the keyring); False if busy."""
        if self.busy:
            self.error.emit("Wait for the current answer or load to finish, or stop it first.")
            return False
        if self.remote is not None:
            self.remote.close()
        self.remote = RemoteChat(endpoint, model_id, keys.api_key(endpoint.base_url))
        self.remote_model_chosen.emit(self.remote.describe())
        return True

    def shutdown(self) -> None:
        """Stop the current job, save what streamed, and end the engine thread."""
        job = self._job
        self.engine.stop(job)
        self.headers.stop()
        if self.scheduler is not None:
            self.scheduler.close()
            self.scheduler = None
        if self._answer is not None:
            self._answer["saver"].flush(self._answer["metrics"], MessageState.CANCELLED)
        if self.remote is not None:
            self.remote.close()
        self._release_model()

    # -- models ------------------------------------------------------------------

    def load(self, path: str | Path, name: str | None = None) -> bool:
        """Load a model file on the engine thread; False if something else is running."""
        if self.busy:
            self.error.emit("Wait for the current answer or load to finish, or stop it first.")
            return False
        path = Path(path)
        model_settings = self.store.model_settings(path)
        settings = with_model_settings(self.settings, model_settings, model_settings.draft_model is not None)
        self._loading_for = self._build_key(settings, model_settings)
        if self.remote is not None:  # a local model chosen: the remote one steps aside
            self.remote.close()
            self.remote = None
        self._unloaded_for = None
        self.model_loading.emit(path.name)

        def run(
            cancel: threading.Event,
        ) -> tuple[LoadedModel, ModelInfo, ChatSession, ModelSettings, LoadedModel | None]:
            # Validate the file and check its size before letting go of the current model,
            # so a bad or oversized file leaves the chat as it was. The header is read once.
            model_file = open_gguf(path)
            try:
                info = describe_model(model_file, name)
                current, backend = self.model_info, planned_backend(settings.backend)
                freed = current.memory_needed(settings.context_length, backend) if current and self.loaded else 0
                free_now = available_memory()
                fits, verdict = info.memory_verdict(settings.context_length, free_now + freed, backend)
                if not info.can_run(settings.context_length, free_now + freed):
                    raise OutOfMemory(f"{info.name} {verdict}.")
                # The current model stays until the new one is ready, where both fit; otherwise it goes first.
                keep_current = info.memory_verdict(settings.context_length, free_now, backend)[0]
            except BaseException:
                model_file.close()
                raise
            if not fits:
                self._engine_notice.emit(f"{info.name} {verdict}.")
            if not keep_current and self.loaded is not None:
                self._unloaded_for = (current.name if current else self.loaded.path.name, info.name)
                self._release_model()
            loaded = load_model(
                model_file,
                settings.backend,
                progress=self._engine_progress.emit,
                cancel=cancel,
                threads=settings.cpu_threads or None,
            )
            if loaded.load_notes:
                self._engine_notice.emit(load_notes_text(info.name, loaded.load_notes))
            draft = None
            try:
                if model_settings.template is not None:
                    loaded.template = template_override(loaded.template, model_settings.template, info.name)
                draft = self._draft_for(loaded, info.name, model_settings, settings)
                session = self._new_session(loaded, settings, draft)
            except BaseException:
                loaded.close()
                if draft is not None:
                    draft.close()
                raise
            self._release_model()  # the previous model, kept while the new one loaded
            return loaded, info, session, model_settings, draft

        self._start(Job(run, "load"))
        return True

    def unload(self) -> None:
        """Release the loaded model (on the engine thread, after any running job)."""
        if self.busy:
            return
        self._start(Job(lambda cancel: self._release_model(), "unload"))

    def cancel(self) -> None:
        """Cancel the running load or answer; it stops within one step."""
        if self._job is not None:
            self._job.cancel.set()

    def apply_settings(self, settings: Settings) -> None:
        """Use new settings: reload for a new backend or thread count, rebuild the session for a
        new context.

        While an answer or a load runs, those two wait until it ends; the rest (sampling,
        max tokens, system prompt) applies from the next answer.
        """
        self.settings = settings
        self._apply_model_settings()

    def set_model_settings(self, path: str | Path, model_settings: ModelSettings) -> None:
        """Keep a model file's own settings; for the loaded model they apply as `apply_settings` says."""
        self.store.set_model_settings(path, model_settings)
        if self.loaded is not None and Path(path) == self.loaded.path:
            self.model_settings = model_settings
            self._apply_model_settings()

    @staticmethod
    def _build_key(settings: Settings, model_settings: ModelSettings) -> BuildKey:
        """What a load or session was built with: a change in the first two, the template or the draft reloads."""
        draft = model_settings.draft_model if settings.speculative != "off" else None
        return settings.backend, settings.cpu_threads, settings.context_length, model_settings.template, draft

    def _apply_model_settings(self) -> None:
        settings = with_model_settings(self.settings, self.model_settings, self.model_settings.draft_model is not None)
        if self.loaded is None or self.busy or self._built_for is None:
            return
        built = self._built_for
        wanted = self._build_key(settings, self.model_settings)
        if wanted[:2] + wanted[3:] != built[:2] + built[3:]:
            self.load(self.loaded.path, self.model_info.name if self.model_info else None)
        elif wanted != built:
            loaded, draft = self.loaded, self._draft
            self._built_for = wanted
            self._start(Job(lambda cancel: self._new_session(loaded, settings, draft), "session"))

    def _release_model(self) -> None:
        """Engine thread: stop the scheduler (ending any server request), drop the session, close the model,
        and give the memory back to the system."""
        self._session = None
        if self.scheduler is not None:
            self.scheduler.close()
            self.scheduler = None
        if self._draft is not None:
            self._draft.close()
            self._draft = None
        if self.loaded is not None:
            self.loaded.close()
            self.loaded = None
            release_freed_memory()

    def _draft_for(
        self, loaded: LoadedModel, name: str, model_settings: ModelSettings, settings: Settings
    ) -> LoadedModel | None:
        """Engine thread: the draft model set for `loaded`, or None; one that cannot draft is said, not fatal."""
        if model_settings.draft_model is None or settings.speculative == "off":
            return None
        try:
            return load_draft(model_settings.draft_model, loaded, settings.backend, settings.cpu_threads or None)
        except SprigError as exc:
            self._engine_notice.emit(f"{name} answers without its draft model: {exc}")
            return None

    @staticmethod
    def _new_session(loaded: LoadedModel, settings: Settings, draft: LoadedModel | None = None) -> ChatSession:
        """A session for `loaded` (with `draft` drafting); speculation's costs c(T) are measured here, at load,
        not in the first answer."""
        mode = settings.speculative if draft is not None or settings.speculative != "draft" else "auto"
        speculation = Speculation(mode, draft=draft)
        if speculation.enabled:
            speculation.prepare(loaded.model)
        return ChatSession(
            loaded, n_ctx=settings.context_length, max_tokens=settings.max_tokens, speculation=speculation
        )

    # -- conversations -----------------------------------------------------------

    def open_conversation(self, conversation_id: int | None) -> None:
        """Show a stored conversation (None: a fresh, unsaved one)."""
        if self.busy and self._answer is not None:
            self.error.emit("Stop the current answer before switching conversations.")
            return
        self.settings = replace(self.settings, last_conversation=conversation_id)
        if conversation_id is None:
            self.conversation = None
            self.conversation_opened.emit(None, [])
            return
        self.conversation = self.store.conversation(conversation_id)
        messages = [message_dict(m) for m in self.store.messages(conversation_id)]
        self.conversation_opened.emit(self.conversation, messages)

    def rename_conversation(self, conversation_id: int, title: str) -> None:
        """Give a conversation a new title."""
        self.store.rename_conversation(conversation_id, title.strip() or "Untitled")
        self.conversations_changed.emit()

    def delete_conversation(self, conversation_id: int) -> None:
        """Delete a conversation and its messages."""
        if self.conversation is not None and self.conversation.id == conversation_id:
            if self._answer is not None:
                self.error.emit("Stop the current answer before deleting this conversation.")
                return
            self.open_conversation(None)
        self.store.delete_conversation(conversation_id)
        self.conversations_changed.emit()

    def set_overrides(self, overrides: dict) -> None:
        """Per-conversation sampling overrides for the open conversation."""
        if self.conversation is None:
            self.conversation = self.store.create_conversation()
            self.conversations_changed.emit()
        self.store.set_overrides(self.conversation.id, overrides)
        self.conversation = self.store.conversation(self.conversation.id)

    # -- answering -----------------------------------------------------------------

    def send(self, text: str) -> bool:
        """Store a user message and answer it. False (with an error) if that cannot start."""
        text = text.strip()
        if not text or not self._can_answer():
            return False
        if self.conversation is None:
            self.conversation = self.store.create_conversation(title_from(text))
            self.settings = replace(self.settings, last_conversation=self.conversation.id)
            self.conversation_opened.emit(self.conversation, [])
        self.message_added.emit(message_dict(self.store.add_message(self.conversation.id, "user", text)))
        self.conversations_changed.emit()
        self._begin_answer()
        return True

    def regenerate(self) -> bool:
        """Answer the last message again; the earlier answer stays as a version of it."""
        if self.conversation is None or not self._can_answer():
            return False
        messages = self.store.messages(self.conversation.id)
        if not messages:
            return False
        if messages[-1].role != "assistant":
            self._begin_answer()
            return True
        last = messages[-1]
        self.messages_truncated.emit(last.position)
        self._begin_answer(self.store.new_version(last.id, model=self._model_name()))
        return True

    def continue_answer(self) -> bool:
        """Go on writing the last answer, where Stop or the token limit ended it."""
        if self.conversation is None or not self._can_answer():
            return False
        messages = self.store.messages(self.conversation.id)
        last = messages[-1] if messages else None
        if last is None or last.role != "assistant" or not last.content or not ended_early(last.state, last.metrics):
            self.error.emit("There is no stopped or cut-off answer to continue.")
            return False
        self.store.update_message(last.id, last.content, state=MessageState.STREAMING)
        self.messages_truncated.emit(last.position)
        self._begin_answer(self.store.message(last.id), continuing=True)
        assert self._answer is not None  # just begun
        self._answer["before"] = (last.content, last.metrics or {}, last.state)  # kept if it fails at once
        return True

    def show_version(self, position: int, index: int) -> None:
        """Show version `index` of the message at `position` (the 1/2 switcher)."""
        if self.conversation is None or self._answer is not None:
            return
        message = next(m for m in self.store.messages(self.conversation.id) if m.position == position)
        self.store.show_version(message.id, index)
        self.open_conversation(self.conversation.id)

    def edit(self, position: int, text: str) -> bool:
        """Give the user message at `position` a new version and answer it again.

        The earlier version stays, with the answers that followed it (the 1/2 switcher).
        """
        text = text.strip()
        if self.conversation is None or not text or not self._can_answer():
            return False
        message = next(m for m in self.store.messages(self.conversation.id) if m.position == position)
        edited = self.store.new_version(message.id, text, state=MessageState.COMPLETE)
        self.messages_truncated.emit(position)
        self.message_added.emit(message_dict(edited))
        self._begin_answer()
        return True

    def new_chat_with_summary(self) -> bool:
        """Summarize the open chat (on the engine thread), then open a new chat that starts from the summary.

        The summary becomes the new chat's own system prompt, after the usual one; the old
        chat stays as it was. False (with an error) if that cannot start.
        """
        conversation, chat = self.conversation, self.chat_engine
        if conversation is None or not self._can_answer():
            return False
        assert chat is not None  # _can_answer made sure of it
        settings = effective_sampling(self.effective_settings, conversation.overrides)
        history = [
            {"role": m.role, "content": m.content}
            for m in self.store.messages(conversation.id)
            if m.state != MessageState.ERROR and m.content
        ]
        system = [{"role": "system", "content": settings.system_prompt}] if settings.system_prompt.strip() else []
        messages = [*system, *history, {"role": "user", "content": SUMMARY_REQUEST}]
        context = chat.describe().context_length
        max_tokens = min(SUMMARY_TOKENS, context // 8) if context else SUMMARY_TOKENS  # the new chat must have room
        params = sampling_params(replace(settings, temperature=0.0))

        def run(cancel: threading.Event) -> str:
            return "".join(event.text for event in chat.stream(messages, params, max_tokens, cancel)).strip()

        self._summary_of = conversation
        self.model_notice.emit(f"Writing a summary of “{conversation.title}” for a new chat…")
        self._start(Job(run, "summary"))
        return True

    def _finish_summary(self, summary: str | None) -> None:
        """Open the new chat that starts from `summary` (None: it failed, and said why, or was stopped)."""
        source, self._summary_of = self._summary_of, None
        if summary is None or source is None:
            return
        if not summary:
            self.error.emit("The summary came out empty, so no new chat was made; the chat is as it was.")
            return
        base = effective_sampling(self.effective_settings, source.overrides).system_prompt.strip()
        prompt = f"{base}\n\n" if base else ""
        prompt += f"A summary of an earlier conversation with this user, to continue from:\n{summary}"
        created = self.store.create_conversation(title_from(f"{source.title} (continued)"))
        self.store.set_overrides(created.id, {"system_prompt": prompt})
        self.conversations_changed.emit()
        self.open_conversation(created.id)
        self.notice.emit(
            f"This chat continues “{source.title}” from its summary (kept as this chat's system prompt, "
            f"in Chat settings): {summary}"
        )

    def _can_answer(self) -> bool:
        if self.busy:
            self.error.emit("Sprig is still busy with the last request; stop it or wait.")
            return False
        if self.chat_engine is None:
            self.error.emit("No model is loaded. Choose one in the model picker, or drop a .gguf file here.")
            return False
        return True

    def _model_name(self) -> str:
        chat = self.chat_engine
        assert chat is not None  # answers start only with a model to answer
        return chat.describe().name

    def _begin_answer(self, assistant: Message | None = None, continuing: bool = False) -> None:
        """Answer the stored history into `assistant` (a new message when None).

        `continuing`: `assistant` holds the start of the answer, which is continued.
        """
        conversation, chat = self.conversation, self.chat_engine
        assert conversation is not None and chat is not None  # _can_answer made sure of both
        if assistant is None:
            assistant = self.store.add_message(
                conversation.id, "assistant", "", model=self._model_name(), state=MessageState.STREAMING
            )
        history = [
            m
            for m in self.store.messages(conversation.id)
            if m.state != MessageState.ERROR and m.content and m.id != assistant.id
        ]
        settings = effective_sampling(self.effective_settings, conversation.overrides)
        self._answer = {
            "id": assistant.id,
            "text": assistant.content,
            "metrics": {},
            "state": MessageState.COMPLETE,
            "saver": ThrottledSaver(self.store, assistant.id, text=assistant.content),
        }
        turns = [{"role": m.role, "content": m.content} for m in history]
        system = [{"role": "system", "content": settings.system_prompt}] if settings.system_prompt.strip() else []
        messages = system + turns + ([{"role": "assistant", "content": assistant.content}] if continuing else [])
        if isinstance(chat, LocalChatEngine):
            chat.speculative = settings.speculative
            chat.adapters = conversation_adapters(conversation.overrides)  # the engine refuses a misfit
        self.store.set_model_uri(conversation.id, chat.describe().uri)

        def run(cancel: threading.Event):
            events = chat.stream(messages, sampling_params(settings), settings.max_tokens, cancel, continuing)
            return explain_no_room(events) if continuing else events

        self.answer_started.emit(message_dict(assistant))
        self._start(Job(run, "answer"))

    # -- job plumbing --------------------------------------------------------------

    def _start(self, job: Job) -> None:
        self._job = job
        self.busy_changed.emit(True)
        self.engine.worker.submit(job)

    def _on_yielded(self, job: Job, events: list[GenerationEvent]) -> None:
        answer, conversation = self._answer, self.conversation
        if job is not self._job or answer is None or conversation is None:
            return
        for event in events:
            if event.notice and conversation.id not in self._told_overflow:
                self._told_overflow.add(conversation.id)  # it would say the same every turn from now on
                self.notice.emit(event.notice)
            answer["text"] += event.text
            answer["metrics"] = event.metrics.as_dict()
            if event.finish_reason == FINISH_CANCELLED:
                answer["state"] = MessageState.CANCELLED
            if event.finish_reason is not None:
                answer["finish_reason"] = event.finish_reason
        answer["saver"].set_text(answer["text"])
        self.answer_text.emit(answer["text"])
        self.answer_metrics.emit(answer["metrics"])

    def _on_errored(self, job: Job, message: str) -> None:
        if job is not self._job:
            return
        if job.kind == "load" and job.cancel.is_set():  # the user asked for it: news, not an error
            self.model_notice.emit(message)
            return
        if self._answer is not None:
            self._answer["state"] = MessageState.ERROR
            self._answer["metrics"] = {**self._answer["metrics"], "error": message}
        self.error.emit(message)

    def _on_finished(self, job: Job, result: object) -> None:
        if job is not self._job:
            return
        self._job = None
        if job.kind == "load":
            self._finish_load(result if isinstance(result, tuple) else None)
        elif job.kind == "unload":
            self.model_info, self.model_settings = None, ModelSettings()
            self.model_unloaded.emit()
        elif job.kind == "session" and isinstance(result, ChatSession):
            self._session = result
            self.context_changed.emit(result.cache.n_ctx)
        elif job.kind == "summary":
            self._finish_summary(result if isinstance(result, str) and not job.cancel.is_set() else None)
        elif job.kind == "answer":
            answer = self._answer
            if job.cancel.is_set() and answer is not None and "finish_reason" not in answer:
                answer["state"] = MessageState.CANCELLED  # stopped while it waited its turn
            self._finish_answer()
        self.busy_changed.emit(False)
        self._apply_model_settings()  # a backend or context change made while busy

    def _finish_load(self, result: tuple | None) -> None:
        if result is None:  # failed or cancelled
            if self.loaded is not None:  # the current model is still there
                self.model_loaded.emit(self.model_info)
                return
            self._session, self.model_info, self.model_settings = None, None, ModelSettings()
            self.model_unloaded.emit()
            if self._unloaded_for is not None:
                previous, wanted = self._unloaded_for
                self.model_notice.emit(
                    f"{previous} was unloaded to make room for {wanted}, which did not load, so no model is "
                    "loaded now. Choose one with the model button."
                )
            return
        self.loaded, self.model_info, self._session, self.model_settings, self._draft = result
        self._built_for = self._loading_for
        self.scheduler = Scheduler()
        self.settings = replace(self.settings, last_model=str(self.loaded.path))
        self.store.add_model(str(self.loaded.path), self.model_info.name)
        self.store.touch_model(str(self.loaded.path))
        backend = self.loaded.backend
        self.backend_changed.emit(backend.name, backend.device_name, list(self.loaded.backend_notes))
        self.model_loaded.emit(self.model_info)
        self.context_changed.emit(self._session.cache.n_ctx)
        template_notice = self.loaded.template.notice(self.model_info.name)
        if template_notice:
            self.model_notice.emit(template_notice)

    def _finish_answer(self) -> None:
        answer, self._answer = self._answer, None
        assert answer is not None  # an answer job always begins one
        before = answer.get("before")
        if before and answer["state"] == MessageState.ERROR and answer["text"] == before[0]:
            answer["metrics"], answer["state"] = before[1:]  # a continuation that wrote nothing: as it was
        if answer.get("finish_reason"):
            answer["metrics"] = {**answer["metrics"], "finish_reason": answer["finish_reason"]}
        answer["saver"].flush(answer["metrics"], answer["state"])
        self.answer_finished.emit(answer["metrics"], answer["state"])
        self.conversations_changed.emit()
