"""The one protocol the app answers through, whether the model runs here or on a server.

A `ChatEngine` says what it knows about its model (`describe`) and streams an answer for
a list of messages, with sampling parameters and a cancel flag, as `GenerationEvent`s.
`LocalChatEngine` runs a loaded model's `ChatSession` (its turn on the model taken through
the `Scheduler`, ahead of the local server's requests); `engine.remote.client.RemoteChat`
streams from an OpenAI-compatible server.
"""

import threading
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Protocol

from engine.chat_session import ChatSession
from engine.generation import GenerationEvent
from engine.sampling import SamplingParams
from engine.server.scheduler import APP, Scheduler


@dataclass(frozen=True)
class ModelDescription:
    """What the app can say about a chat engine's model: its URI, its name, where it runs,
    and its context length in tokens where that is known."""

    uri: str
    name: str
    where: str = "local"
    context_length: int | None = None


class ChatEngine(Protocol):
    """A model to chat with: local or remote."""

    def describe(self) -> ModelDescription:
        """The model's URI, name, where it runs and context length."""
        ...

    def stream(
        self,
        messages: list[dict],
        params: SamplingParams,
        max_tokens: int,
        cancel: threading.Event,
        continuing: bool = False,
    ) -> Iterator[GenerationEvent]:
        """The answer to `messages` (role/content dicts, any system prompt first), as events.

        `continuing`: the last message is the start of an answer, to go on with. Setting
        `cancel` ends the stream with a FINISH_CANCELLED event; failures raise SprigError.
        """
        ...

    def close(self) -> None:
        """Release what the engine holds open (a remote client's connections)."""
        ...


class LocalChatEngine:
    """A loaded model's chat session as a chat engine. Streams run on the caller's thread (the app's worker)."""

    def __init__(self, session: ChatSession, scheduler: Scheduler, description: ModelDescription):
        self.session, self.scheduler, self.description = session, scheduler, description
        self.speculative = session.speculation.mode if session.speculation else "off"  # the mode of the next answer
        self.adapters: list[tuple[str, float]] | None = None  # the next answer's LoRA adapters (None: as they are)

    def describe(self) -> ModelDescription:
        """The loaded file's URI and name, and the session's context length."""
        return self.description

    def close(self) -> None:
        """Nothing to do: the model belongs to its host, which closes it."""

    def stream(
        self,
        messages: list[dict],
        params: SamplingParams,
        max_tokens: int,
        cancel: threading.Event,
        continuing: bool = False,
    ) -> Iterator[GenerationEvent]:
        """Wait for the model's turn (ahead of the server's requests), then stream the session's answer."""
        session = self.session

        adapters = self.adapters

        def answer(cancel: threading.Event) -> Iterator[GenerationEvent]:
            if adapters is not None:  # in the model's turn: no other request runs while they change
                session.loaded.model.adapters.use(adapters)
            session.params, session.max_tokens = params, max_tokens
            if session.speculation is not None and session.speculation.mode != self.speculative:
                session.speculation = replace(session.speculation, mode=self.speculative)
            if continuing:
                session.messages = list(messages)
                return session.continue_answer(cancel)
            session.messages = list(messages[:-1])
            return session.send(messages[-1]["content"], cancel)

        return self.scheduler.stream(answer, cancel, APP)

    def complete(
        self, text: str, params: SamplingParams, max_tokens: int, cancel: threading.Event
    ) -> Iterator[GenerationEvent]:
        """Wait for the model's turn, then stream its continuation of `text` (no chat template)."""
        session = self.session

        def continuation(cancel: threading.Event) -> Iterator[GenerationEvent]:
            session.params, session.max_tokens = params, max_tokens
            return session.complete(text, cancel)

        return self.scheduler.stream(continuation, cancel, APP)
