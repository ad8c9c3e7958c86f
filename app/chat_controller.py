"""The chat controller: conversations and their answers, between the GUI, the engine and the store.

It lives on the GUI thread. The model itself (load, unload, switch, remote) is its
`ModelHost`'s (`models`); answers run as jobs on the engine thread the two share (a
`JobRunner`), and their results come back as queued signals. The store is the source of
truth for conversations: before each answer the controller hands the engine the stored
history, and the `ChatSession` reuses whatever prefix of it the KV cache already holds,
so a new turn prefills only its new tokens and an edit or regenerate rewinds the cache
to where the conversation diverged. Answers are saved while they stream.

No widgets here: the window connects these signals to its widgets.
"""

import threading
from collections.abc import Iterator
from dataclasses import replace

from PySide6.QtCore import QObject, Signal

from app.adapter_library import conversation_adapters
from app.conversation_states import ConversationStates
from app.header_reader import HeaderReader
from app.model_host import ModelHost
from app.settings import Settings, effective_sampling, sampling_params
from app.storage import Conversation, Message, MessageState, Store, ThrottledSaver, ended_early
from app.worker import Handlers, Job, JobRunner
from engine.chat_engine import ChatEngine, LocalChatEngine
from engine.errors import ContextFullError
from engine.generation import FINISH_CANCELLED, GenerationEvent
from engine.loader import LoadedModel
from engine.model_info import ModelInfo
from engine.model_uri import parse_model_uri

TITLE_LENGTH = 48
SUMMARY_REQUEST = (
    "Summarize our conversation so far in a short paragraph: the questions, the answers and "
    "anything still open. Write only the summary."
)
SUMMARY_TOKENS = 256  # the most a summary may take (an eighth of the context, in small contexts)


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
    """Runs answers in conversations, and keeps the store up to date; its `models` hold the model."""

    busy_changed = Signal(bool)  # the engine thread took a job (an answer, a load) or is free again
    conversations_changed = Signal()
    conversation_opened = Signal(object, list)  # Conversation, [message dicts]
    messages_truncated = Signal(int)  # messages at and after this position were removed
    message_added = Signal(dict)  # a stored user message
    answer_started = Signal(dict)  # the assistant message dict, empty content
    answer_text = Signal(str)  # the whole answer so far
    answer_metrics = Signal(dict)  # Metrics.as_dict() of the answer so far
    answer_finished = Signal(dict, str)  # final metrics, state
    completion_text = Signal(str)  # the model's next words, for the completion view (base models)
    completion_finished = Signal(dict, str)  # the completion's final metrics, state
    notice = Signal(str)  # something the user should know about the chat (dropped turns)
    quiet_notice = Signal(str)  # a note for the conversation alone (its saved state was not used)
    model_notice = Signal(str)  # something to know about the model (the host's) or a job under way
    error = Signal(str)  # something went wrong (here or in the host); the engine's message, intact

    def __init__(self, store: Store, settings: Settings, parent: QObject | None = None):
        super().__init__(parent)
        self.store = store
        self.settings = settings
        self.jobs = JobRunner(self)
        self.jobs.busy_changed.connect(self.busy_changed)
        self.saved_states = ConversationStates(store.path, lambda: self.settings.saved_states_mb)
        self.models = ModelHost(self.jobs, store, lambda: self.settings, self, save_state=self.saved_states.save_now)
        self.models.model_notice.connect(self.model_notice)
        self.models.error.connect(self.error)
        self.models.model_loaded.connect(self._remember_model)
        self.headers = HeaderReader(self)  # the model picker's, on a thread of its own
        self.conversation: Conversation | None = None
        self._answer: dict | None = None  # the streaming answer: message id, text, metrics, saver
        self._told_overflow: set[int] = set()  # conversations already told that old turns were left out
        self._summary_of: Conversation | None = None  # the chat being summarized for a new one

    # -- state -------------------------------------------------------------------

    @property
    def busy(self) -> bool:
        """True while a job (loading or answering) runs on the engine thread."""
        return self.jobs.busy

    @property
    def answering(self) -> bool:
        """True while an answer is being generated."""
        return self.jobs.kind() == "answer"

    @property
    def loading(self) -> bool:
        """True while a model is loading."""
        return self.jobs.kind() == "load"

    @property
    def loaded(self) -> LoadedModel | None:
        """The loaded local model file (the host's), or None."""
        return self.models.loaded

    @property
    def model_info(self) -> ModelInfo | None:
        """What is known about the loaded local model (the host's), or None."""
        return self.models.info

    @property
    def chat_engine(self) -> ChatEngine | None:
        """What answers now (the host's): a remote model, the loaded local one, or None."""
        return self.models.chat_engine

    def cancel(self) -> None:
        """Cancel the running load or answer; it stops within one step."""
        self.jobs.cancel()

    def apply_settings(self, settings: Settings) -> None:
        """Use new settings: the host reloads for a new backend or thread count and rebuilds the session
        for a new context, once the engine thread is free; the rest (sampling, max tokens, system prompt)
        applies from the next answer."""
        self.settings = settings
        self.models.apply_settings()

    def shutdown(self) -> None:
        """Stop the current job, save what streamed, end the engine thread and release the model (saving
        the state of the conversation it holds)."""
        self.jobs.stop()
        self.headers.stop()
        if self._answer is not None:
            self._answer["saver"].flush(self._answer["metrics"], MessageState.CANCELLED)
        self.models.close()

    def _remember_model(self, info: ModelInfo) -> None:
        self.settings = replace(self.settings, last_model=str(info.path))

    # -- conversations -----------------------------------------------------------

    def open_conversation(self, conversation_id: int | None) -> None:
        """Show a stored conversation (None: a fresh, unsaved one)."""
        if self.busy and self._answer is not None:
            self.error.emit("Stop the current answer before switching conversations.")
            return
        self.settings = replace(self.settings, last_conversation=conversation_id)
        self.saved_states.leave(self.models.session, self.jobs.engine.worker)
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
        self.saved_states.discard(conversation_id, self.models.session)
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
        settings = effective_sampling(self.models.effective_settings, conversation.overrides)
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
        job = Job(run, "summary")
        self.jobs.start(job, Handlers(lambda result: self._finish_summary(job, result), self.error.emit))
        return True

    def _finish_summary(self, job: Job, summary: object) -> None:
        """Open the new chat that starts from `summary` (None: it failed, and said why, or was stopped)."""
        source, self._summary_of = self._summary_of, None
        if not isinstance(summary, str) or job.cancel.is_set() or source is None:
            return
        if not summary:
            self.error.emit("The summary came out empty, so no new chat was made; the chat is as it was.")
            return
        base = effective_sampling(self.models.effective_settings, source.overrides).system_prompt.strip()
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

    def complete(self, text: str) -> bool:
        """Let the loaded model go on with `text` as it stands, with no chat template (the completion view,
        for base models), with the usual sampling settings and answer length. False (with an error) if that
        cannot start."""
        chat = self.chat_engine
        if self.busy:
            self.error.emit("Sprig is still busy with the last request; stop it or wait.")
            return False
        if not isinstance(chat, LocalChatEngine):
            self.error.emit(
                "Only a model loaded on this computer continues text here; choose one with the model button."
            )
            return False
        settings = effective_sampling(self.models.effective_settings, {})
        outcome: dict = {"metrics": {}, "state": MessageState.COMPLETE}

        def yielded(events: list[GenerationEvent]) -> None:
            outcome["metrics"] = events[-1].metrics.as_dict()
            if any(event.finish_reason == FINISH_CANCELLED for event in events):
                outcome["state"] = MessageState.CANCELLED
            if text := "".join(event.text for event in events):
                self.completion_text.emit(text)
            self.answer_metrics.emit(outcome["metrics"])

        def failed(message: str) -> None:
            outcome["state"] = MessageState.ERROR
            self.error.emit(message)

        def run(cancel: threading.Event) -> Iterator[GenerationEvent]:
            return chat.complete(text, sampling_params(settings), settings.max_tokens, cancel)

        def finished(_result: object) -> None:
            self.completion_finished.emit(outcome["metrics"], outcome["state"])

        self.jobs.start(Job(run, "completion"), Handlers(finished, failed, yielded))
        return True

    def _can_answer(self) -> bool:
        if self.busy:
            self.error.emit("Sprig is still busy with the last request; stop it or wait.")
            return False
        if self.chat_engine is None:
            self.error.emit(self._why_no_model())
            return False
        return True

    def _why_no_model(self) -> str:
        """Why nothing can answer: the open chat's server was removed, or no model is chosen."""
        uri = self.conversation.model_uri if self.conversation else None
        try:
            ref = parse_model_uri(uri) if uri else None
        except ValueError:
            ref = None
        if ref is not None and ref.is_remote and ref.base_url not in {e.base_url for e in self.store.endpoints()}:
            return (
                f"This chat's model, {ref.model_id}, was on a server that has been removed ({ref.base_url}). "
                "To continue the chat, choose another model with the model button, or add the server again "
                "(Settings → Models)."
            )
        return "No model is loaded. Choose one in the model picker, or drop a .gguf file here."

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
        settings = effective_sampling(self.models.effective_settings, conversation.overrides)
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
            if isinstance(chat, LocalChatEngine):
                self.saved_states.attach(chat.session, conversation.id)
            events = chat.stream(messages, sampling_params(settings), settings.max_tokens, cancel, continuing)
            return explain_no_room(events) if continuing else events

        self.answer_started.emit(message_dict(assistant))
        job = Job(run, "answer")
        self.jobs.start(job, Handlers(lambda _result: self._end_answer(job), self._answer_failed, self._on_yielded))

    # -- the answer's job (GUI thread) ----------------------------------------------------

    def _on_yielded(self, events: list[GenerationEvent]) -> None:
        answer, conversation = self._answer, self.conversation
        if answer is None or conversation is None:
            return
        for event in events:
            if event.state_refused:
                self.quiet_notice.emit(
                    f"This conversation was read again from its text: its saved state was not used "
                    f"({event.state_refused})."
                )
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

    def _answer_failed(self, message: str) -> None:
        if self._answer is not None:
            self._answer["state"] = MessageState.ERROR
            self._answer["metrics"] = {**self._answer["metrics"], "error": message}
        self.error.emit(message)

    def _end_answer(self, job: Job) -> None:
        answer = self._answer
        if job.cancel.is_set() and answer is not None and "finish_reason" not in answer:
            answer["state"] = MessageState.CANCELLED  # stopped while it waited its turn
        self._finish_answer()

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
