"""Multi-turn chat through the model's template, reusing the KV cache between turns.

Every turn renders the whole conversation and tokenizes it; `generate` then prefills
only the tokens after the longest prefix the cache already holds. An edited or
regenerated turn therefore rewinds the cache to where the conversation diverged. When
the conversation no longer fits, the oldest turns are dropped (the system prompt stays)
and a notice event says so.
"""

import threading
from collections.abc import Iterator

from engine.errors import ContextFullError
from engine.generation import GenerationEvent, generate
from engine.loader import LoadedModel
from engine.sampling import SamplingParams
from engine.saved_state import ConversationState
from engine.speculation import Speculation


def chat_prompt_tokens(
    loaded: LoadedModel, messages: list[dict], answer_start: str = "", tools: list[dict] | None = None
) -> list[int]:
    """Render `messages` with the model's template (generation prompt on) and tokenize them.

    `answer_start` is the beginning of the assistant's answer, written after the prompt, to
    continue from. `tools` (OpenAI function definitions) go to the template as they are.
    BOS is added when the vocabulary asks for it, unless the template already wrote it.
    """
    tokenizer = loaded.tokenizer
    text = loaded.template.render(messages, add_generation_prompt=True, tools=tools) + answer_start
    bos_text = tokenizer.token_text(tokenizer.bos_id) if tokenizer.bos_id is not None else None
    add_bos = tokenizer.add_bos and not (bos_text and text.startswith(bos_text))
    return tokenizer.encode(text, add_bos=add_bos, parse_special=True)


def answer_stops(loaded: LoadedModel) -> dict:
    """Keyword arguments for `generate` that end an answer where the chat format ends a turn.

    The template's end-of-turn texts stop as text, and as tokens where the vocabulary has
    a token of that text (a control token adds no text to the answer, so only its id shows).
    """
    stops = loaded.template.stops
    special = loaded.tokenizer.special_tokens
    return {"stop_strings": stops, "stop_ids": {special[text] for text in stops if text in special}}


class ChatSession:
    """One conversation with one loaded model."""

    def __init__(
        self,
        loaded: LoadedModel,
        *,
        system_prompt: str | None = None,
        n_ctx: int | None = None,
        params: SamplingParams = SamplingParams(),
        max_tokens: int = 512,
        speculation: Speculation | None = None,
    ):
        self.loaded = loaded
        self.speculation = speculation
        self.cache = loaded.new_cache(n_ctx)
        self.params = params
        self.max_tokens = max_tokens
        self.messages: list[dict[str, str]] = []
        self.saved: ConversationState | None = None  # where the conversation's state is saved (the app's)
        if system_prompt:
            self.messages.append({"role": "system", "content": system_prompt})

    # -- turns -------------------------------------------------------------------

    def send(self, text: str, cancel: threading.Event | None = None) -> Iterator[GenerationEvent]:
        """Add a user message and stream the assistant's answer."""
        self.messages.append({"role": "user", "content": text})
        return self._answer(cancel)

    def regenerate(self, cancel: threading.Event | None = None) -> Iterator[GenerationEvent]:
        """Drop the last answer and stream a new one."""
        if self.messages and self.messages[-1]["role"] == "assistant":
            self.messages.pop()
        if not self.messages or self.messages[-1]["role"] != "user":
            raise ValueError("there is no user message to answer")
        return self._answer(cancel)

    def continue_answer(self, cancel: threading.Event | None = None) -> Iterator[GenerationEvent]:
        """Go on writing the last message, an assistant's answer that ended early."""
        if not self.messages or self.messages[-1]["role"] != "assistant":
            raise ValueError("there is no answer to continue")
        return self._answer(cancel, continuing=True)

    def complete(self, text: str, cancel: threading.Event | None = None) -> Iterator[GenerationEvent]:
        """Continue `text` as it stands, with no chat template (what a base model is for); the
        conversation is left as it was. Raises ContextFullError for text that leaves no room."""
        tokens = self.loaded.tokenizer.encode(text)
        if len(tokens) >= self.cache.n_ctx:
            raise ContextFullError(
                f"The text is {len(tokens)} tokens long and the context holds {self.cache.n_ctx}: shorten it, "
                "or raise the context length, to leave room for the model to go on."
            )
        return generate(
            self.loaded.model, self.loaded.tokenizer, self.cache, tokens, self.params, max_tokens=self.max_tokens,
            cancel=cancel,
        )  # fmt: skip

    def edit(self, index: int, text: str, cancel: threading.Event | None = None) -> Iterator[GenerationEvent]:
        """Replace user message `index`, forget everything after it, and answer again."""
        if self.messages[index]["role"] != "user":
            raise ValueError(f"message {index} is not a user message")
        del self.messages[index + 1 :]
        self.messages[index] = {"role": "user", "content": text}
        return self._answer(cancel)

    def save_state(self) -> bool:
        """Save the cache as the conversation's state (`saved`), if it holds anything new."""
        return self.saved is not None and self.saved.save(self.cache)

    # -- internals -----------------------------------------------------------------

    def _fit(self, continuing: bool = False) -> tuple[list[int], int]:
        """Tokens of the conversation, dropping the oldest turns until an answer has room.

        `continuing`: the last message is the start of the answer, written after the prompt.
        Returns the tokens and how many messages were dropped.
        """
        room_for_answer = min(self.max_tokens, self.cache.n_ctx // 4)
        first = 1 if self.messages and self.messages[0]["role"] == "system" else 0
        dropped = 0
        while True:
            if continuing:
                tokens = chat_prompt_tokens(self.loaded, self.messages[:-1], self.messages[-1]["content"])
            else:
                tokens = chat_prompt_tokens(self.loaded, self.messages)
            if len(tokens) + room_for_answer <= self.cache.n_ctx:
                return tokens, dropped
            if len(self.messages) - first <= 1:
                raise ContextFullError(
                    f"This message is too long for the context: it needs {len(tokens)} tokens, and "
                    f"{self.cache.n_ctx} are available, including {room_for_answer} kept for the answer. "
                    "Shorten it or raise the context length."
                )
            # Drop the oldest user turn and the answers that followed it.
            del self.messages[first]
            dropped += 1
            while len(self.messages) - first > 1 and self.messages[first]["role"] != "user":
                del self.messages[first]
                dropped += 1

    def _answer(self, cancel: threading.Event | None, continuing: bool = False) -> Iterator[GenerationEvent]:
        tokens, dropped = self._fit(continuing)
        refused = self.saved.restore(self.cache, tokens).refused if self.saved is not None else None
        if refused is not None:
            yield GenerationEvent(state_refused=refused)
        if dropped:
            yield GenerationEvent(
                notice=f"The conversation was longer than the context, so the {dropped} "
                "oldest messages were left out (the system prompt was kept)."
            )
        if continuing:
            answer = self.messages[-1]
        else:
            answer = {"role": "assistant", "content": ""}
            self.messages.append(answer)
        for event in generate(
            self.loaded.model,
            self.loaded.tokenizer,
            self.cache,
            tokens,
            self.params,
            max_tokens=self.max_tokens,
            cancel=cancel,
            speculation=self.speculation,
            **answer_stops(self.loaded),
        ):
            answer["content"] += event.text
            yield event
