"""Streaming chat with a remote OpenAI-compatible server, on the official `openai` client.

`RemoteChat` is the remote side of `engine.chat_engine.ChatEngine`: it streams an answer
for a list of messages as `GenerationEvent`s, the same events a local model gives. The
server's reasoning (`reasoning_content`, or vLLM's `reasoning`) arrives as a `<think>`
block at the start of the text, the form the app already shows as reasoning. Time to
first token comes from the stream; token counts from its final `usage` where the server
sends one. Every failure is raised as a `RemoteError` (see `engine.remote.errors`).
"""

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace

import httpx2
import openai

from engine.chat_engine import ModelDescription
from engine.errors import RemoteError
from engine.generation import FINISH_CANCELLED, GenerationEvent, Metrics
from engine.model_uri import remote_uri
from engine.remote.endpoints import Endpoint
from engine.remote.errors import explain
from engine.sampling import SamplingParams

THINK_OPEN, THINK_CLOSE = "<think>", "</think>\n\n"
CANCEL_POLL = 0.1  # seconds between looks at the cancel flag while a read blocks


@dataclass(frozen=True)
class Timeouts:
    """Seconds to connect, and to wait for each piece of an answer (the first token included)."""

    connect: float = 10.0
    read: float = 120.0


def _client(endpoint: Endpoint, api_key: str | None, timeouts: Timeouts) -> openai.OpenAI:
    timeout = httpx2.Timeout(timeouts.read, connect=timeouts.connect)
    return openai.OpenAI(
        base_url=endpoint.base_url,
        api_key=api_key or "no-key",  # servers without keys ignore it; the client insists on one
        max_retries=0,  # a failure is shown as it is, with the server's Retry-After
        timeout=timeout,
        http_client=httpx2.Client(verify=endpoint.verify_tls, timeout=timeout),
    )


def list_models(endpoint: Endpoint, api_key: str | None, timeouts: Timeouts = Timeouts()) -> list[str]:
    """The ids of the models the server offers (GET /v1/models), sorted; RemoteError if that fails."""
    with _client(endpoint, api_key, timeouts) as client:
        try:
            return sorted(model.id for model in client.models.list())
        except Exception as exc:
            raise explain(exc, endpoint.name) from None


def extended_sampling(params: SamplingParams) -> dict:
    """The sampling fields beyond OpenAI's, sent to servers that take them (llama.cpp, vLLM, SGLang, Sprig)."""
    return {"top_k": params.top_k, "min_p": params.min_p, "repeat_penalty": params.repeat_penalty}


class RemoteChat:
    """One model on one remote server, as a chat engine."""

    def __init__(self, endpoint: Endpoint, model: str, api_key: str | None = None, timeouts: Timeouts = Timeouts()):
        self.endpoint, self.model = endpoint, model
        self._client = _client(endpoint, api_key, timeouts)

    def describe(self) -> ModelDescription:
        """The model's id, its server's name and its URI (the context length is the server's business)."""
        return ModelDescription(remote_uri(self.endpoint.base_url, self.model), self.model, self.endpoint.name)

    def close(self) -> None:
        """Close the client's connections."""
        self._client.close()

    def stream(
        self,
        messages: list[dict],
        params: SamplingParams,
        max_tokens: int,
        cancel: threading.Event,
        continuing: bool = False,
    ) -> Iterator[GenerationEvent]:
        """Stream the answer to `messages` (with `continuing`, the last one is an answer to go on with).

        Setting `cancel` closes the stream: the server sees the connection go and stops.
        A stream that ends without a finish reason was cut, and raises RemoteError, as
        does every other failure; the events before it carry the partial answer.
        """
        started = time.perf_counter()
        try:
            stream = self._client.chat.completions.create(  # type: ignore[call-overload]  # plain message dicts
                model=self.model,
                messages=messages,
                stream=True,
                stream_options={"include_usage": True},
                max_tokens=max_tokens,
                temperature=params.temperature,
                top_p=params.top_p,
                presence_penalty=params.presence_penalty,
                frequency_penalty=params.frequency_penalty,
                seed=openai.omit if params.seed is None else params.seed,
                extra_body=self._extra_fields(params, continuing),
            )
        except Exception as exc:
            raise explain(exc, self.endpoint.name, self.model) from None
        return self._events(stream, started, cancel)

    def _extra_fields(self, params: SamplingParams, continuing: bool) -> dict | None:
        """Fields beyond OpenAI's, for servers that take them: sampling, and going on with the last answer
        (vLLM's and SGLang's names, which Sprig's server takes; llama.cpp's goes on with a last assistant
        message by itself). Elsewhere a last assistant message is sent as it is."""
        if not self.endpoint.extended_sampling:
            return None
        fields = extended_sampling(params)
        if continuing:
            fields |= {"continue_final_message": True, "add_generation_prompt": False}
        return fields

    def _events(self, stream, started: float, cancel: threading.Event) -> Iterator[GenerationEvent]:
        watcher = threading.Thread(target=_close_on_cancel, args=(stream, cancel), daemon=True)
        watcher.start()
        text = _ReasoningText()
        metrics, first, finish, chunks = Metrics(), None, None, 0
        try:
            for chunk in stream:
                now = time.perf_counter()
                if chunk.usage is not None:
                    usage = chunk.usage
                    metrics = _with_usage(metrics, usage.prompt_tokens, usage.completion_tokens)
                for choice in chunk.choices[:1]:
                    delta = choice.delta
                    extras = delta.model_extra or {}
                    piece = text.add(extras.get("reasoning_content") or extras.get("reasoning"), delta.content)
                    if piece:
                        chunks += 1
                        first = first if first is not None else now
                    finish = choice.finish_reason or finish
                    metrics = _timed(metrics, started, first, now, chunks)
                    if piece:
                        yield GenerationEvent(piece, None, None, metrics)
        except Exception as exc:
            if cancel.is_set():
                yield GenerationEvent(text.end(), None, FINISH_CANCELLED, metrics)
                return
            raise explain(exc, self.endpoint.name, self.model) from None
        finally:
            stream.close()
        if cancel.is_set() and finish is None:
            yield GenerationEvent(text.end(), None, FINISH_CANCELLED, metrics)
            return
        if finish is None:
            raise RemoteError(f"{self.endpoint.name} ended the answer without finishing it (the stream was cut).")
        yield GenerationEvent(text.end(), None, finish, metrics)


class _ReasoningText:
    """Joins reasoning and answer deltas into one text: reasoning inside a leading <think> block."""

    def __init__(self) -> None:
        self.thinking = False

    def add(self, reasoning: str | None, content: str | None) -> str:
        """The text for one delta of reasoning and answer (either may be None)."""
        piece = ""
        if reasoning:
            piece += ("" if self.thinking else THINK_OPEN) + reasoning
            self.thinking = True
        if content:
            piece += (THINK_CLOSE if self.thinking else "") + content
            self.thinking = False
        return piece

    def end(self) -> str:
        """The end of a reasoning block left open, if one is."""
        piece, self.thinking = (THINK_CLOSE if self.thinking else ""), False
        return piece


def _with_usage(metrics: Metrics, prompt_tokens: int, completion_tokens: int) -> Metrics:
    return replace(
        metrics,
        prefill_tokens=prompt_tokens,
        decode_tokens=completion_tokens,
        context_used=prompt_tokens + completion_tokens,
    )


def _timed(metrics: Metrics, started: float, first: float | None, now: float, chunks: int) -> Metrics:
    """Metrics with the stream's times: until the first token, and from it on (tokens: usage, else chunks)."""
    if first is None:
        return metrics
    return replace(
        metrics,
        time_to_first_token=first - started,
        prefill_seconds=first - started,
        decode_tokens=max(metrics.decode_tokens, chunks),
        decode_seconds=now - first,
    )


def _close_on_cancel(stream, cancel: threading.Event) -> None:
    """Once `cancel` is set, shut the stream's socket (or return when the stream is done).

    Closing the response would wait for a read that a silent server can hold for the whole
    read timeout; shutting the socket ends that read at once, and the server sees the
    client go. The reading thread then closes the stream itself.
    """
    response = stream.response
    while not response.is_closed:
        if cancel.wait(CANCEL_POLL):
            network = response.extensions.get("network_stream")
            sock = network.get_extra_info("socket") if network is not None else None
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
            return
