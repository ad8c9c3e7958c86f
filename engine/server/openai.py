"""OpenAI's protocol: /v1/models, /v1/chat/completions, /v1/completions and /v1/embeddings.

`router(state)` holds the routes; `engine.server.app.create_app` includes them. Requests are
checked and planned by `engine.server.completions` (the protocol-neutral core) and run on the
one scheduler (`engine.server.scheduler`); this module turns their events into OpenAI's
answers, whole or streamed (server-sent events ending in [DONE]), with its ids, usage and
log-probabilities. Errors take OpenAI's shape (`engine.server.errors`).
"""

import asyncio
import base64
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from sse_starlette import EventSourceResponse

from engine.embedding import EmbeddingError, check_input, embed_tokens, embedding_tokens, pooling
from engine.generation import FINISH_STOP_TOKEN, GenerationEvent
from engine.server.completions import (
    Generation,
    Plan,
    ServedModel,
    finish_reason,
    on_scheduler,
    plan_chat,
    plan_completion,
    usage,
)
from engine.server.errors import APIError, error_body
from engine.server.options import OptionSampler, TokenLogprob, chat_logprobs, completion_logprobs
from engine.server.schemas import ChatCompletionRequest, CompletionRequest, EmbeddingRequest
from engine.server.state import ServerState
from engine.server.tool_calls import parse_tool_calls

log = logging.getLogger("sprig.server")


async def _watch_disconnect(request: Request, answer: "_Answer") -> None:
    """Cancel `answer` when the client goes away (for answers that are not streamed)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            answer.stop()
            return


class _Choice:
    """One of an answer's `n` choices: its generation, the events seen, its log-probabilities."""

    def __init__(self, served: ServedModel, plan: Plan, index: int):
        self.index = index
        self.generation = Generation(served, plan)
        self.text = ""
        self.last: GenerationEvent | None = None
        self.tokens = 0  # events that carried a token (one sampled token each)
        self.logprobs: list[TokenLogprob] = []  # those of the answer's tokens (not of a stop token)
        self.sent_logprobs = 0  # how many of them a stream has sent

    def see(self, event: GenerationEvent) -> None:
        self.text += event.text
        self.last = event
        if event.token is None:
            return
        self.tokens += 1
        sampler = self.generation.sampler
        if not isinstance(sampler, OptionSampler) or sampler.top_logprobs is None:
            return
        if event.finish_reason != FINISH_STOP_TOKEN:  # the end-of-turn token is not part of the text
            self.logprobs.append(sampler.records[self.tokens - 1])

    def unsent_logprobs(self) -> list[TokenLogprob]:
        out = self.logprobs[self.sent_logprobs :]
        self.sent_logprobs = len(self.logprobs)
        return out


class _Answer:
    """One answer being produced: its ids, its choices, and the metrics it leaves behind."""

    def __init__(self, state: ServerState, served: ServedModel, plan: Plan, endpoint: str):
        self.state, self.served, self.plan, self.endpoint = state, served, plan, endpoint
        self.id = f"{'chatcmpl' if endpoint == 'chat' else 'cmpl'}-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.choices = [_Choice(served, plan.choice(i), i) for i in range(plan.n)]
        self._recorded = False
        state.requests_total += 1
        try:
            for choice in self.choices:
                choice.generation.start()
        except APIError:
            self.stop()
            state.metrics.requests.labels(endpoint, "refused").inc()
            raise

    @property
    def with_logprobs(self) -> bool:
        return self.plan.top_logprobs is not None

    def stop(self) -> None:
        for choice in self.choices:
            choice.generation.stop()

    async def events(self) -> AsyncIterator[tuple[_Choice, GenerationEvent]]:
        """Every choice's events, as they come, with the choice each belongs to."""
        if len(self.choices) == 1:
            choice = self.choices[0]
            async for event in choice.generation.events():
                choice.see(event)
                yield choice, event
            return
        merged: asyncio.Queue = asyncio.Queue()

        async def pump(choice: _Choice) -> None:
            try:
                async for event in choice.generation.events():
                    await merged.put((choice, event))
            except BaseException as exc:  # handed to the reader
                await merged.put(exc)
            finally:
                await merged.put(None)

        tasks = [asyncio.create_task(pump(c)) for c in self.choices]
        try:
            running = len(tasks)
            while running:
                item = await merged.get()
                if item is None:
                    running -= 1
                elif isinstance(item, BaseException):
                    raise item
                else:
                    item[0].see(item[1])
                    yield item
        finally:
            for task in tasks:
                task.cancel()
            self.stop()

    def record(self, outcome: str) -> None:
        """Count the answer in the metrics (once; later calls do nothing)."""
        if self._recorded:
            return
        self._recorded = True
        metrics = self.state.metrics
        metrics.requests.labels(self.endpoint, outcome).inc()
        for choice in self.choices:
            ticket = choice.generation.ticket
            if ticket.started is not None:
                metrics.queue_wait.observe(ticket.started - ticket.enqueued)
            if choice.last is None:
                continue
            m = choice.last.metrics
            metrics.prompt_tokens.inc(len(self.plan.prompt))
            metrics.cached_tokens.inc(len(self.plan.prompt) - m.prefill_tokens)
            metrics.generated_tokens.inc(m.decode_tokens)
            if m.time_to_first_token is not None:
                metrics.ttft.observe(m.time_to_first_token)
            if m.decode_tokens_per_second is not None:
                metrics.tokens_per_second.set(m.decode_tokens_per_second)

    def outcome(self) -> str:
        done = all(c.last is not None and finish_reason(c.last) for c in self.choices)
        return "completed" if done else "cancelled"

    def usage(self) -> dict:
        return usage(self.plan, [c.last for c in self.choices])

    def logprobs(self, records: list[TokenLogprob], offset: int = 0) -> dict | None:
        """A choice's `logprobs` object for `records` (None when the request asked for none)."""
        if not self.with_logprobs:
            return None
        tokenizer = self.served.loaded.tokenizer
        if self.endpoint == "chat":
            return chat_logprobs(tokenizer, records)
        return completion_logprobs(tokenizer, records, offset)

    def message(self, choice: _Choice) -> tuple[dict, str | None]:
        """A choice's assistant message and finish reason, tool calls parsed out when asked for."""
        reason = finish_reason(choice.last) if choice.last else None
        if self.plan.parse_tools:
            content, calls = parse_tool_calls(choice.text, self.served.call_style)
            if calls:
                return {
                    "role": "assistant",
                    "content": content,
                    "tool_calls": [c.as_openai() for c in calls],
                }, "tool_calls"
        return {"role": "assistant", "content": choice.text}, reason

    def chunk(self, choice: dict | None, with_usage: bool = False) -> dict:
        kind = "chat.completion.chunk" if self.endpoint == "chat" else "text_completion"
        out = {
            "id": self.id,
            "object": kind,
            "created": self.created,
            "model": self.served.name,
            "choices": [] if choice is None else [{"logprobs": None, **choice}],
        }
        if with_usage:
            out["usage"] = self.usage()
        return out


async def _complete(request: Request, answer: _Answer) -> JSONResponse:
    """Run an answer to its end and send it whole; a client that leaves cancels it."""
    watcher = asyncio.create_task(_watch_disconnect(request, answer))
    try:
        async for _ in answer.events():
            pass
    finally:
        watcher.cancel()
        answer.record(answer.outcome())
    choices = []
    for choice in answer.choices:
        logprobs = answer.logprobs(choice.logprobs)
        if answer.endpoint == "chat":
            message, reason = answer.message(choice)
            choices.append({"index": choice.index, "message": message, "finish_reason": reason, "logprobs": logprobs})
        else:
            reason = finish_reason(choice.last)
            choices.append({"index": choice.index, "text": choice.text, "finish_reason": reason, "logprobs": logprobs})
    return JSONResponse(
        {
            "id": answer.id,
            "object": "chat.completion" if answer.endpoint == "chat" else "text_completion",
            "created": answer.created,
            "model": answer.served.name,
            "choices": choices,
            "usage": answer.usage(),
        }
    )


def _stream(answer: _Answer, include_usage: bool) -> EventSourceResponse:
    """Send an answer as server-sent events, ending in [DONE]; a client that leaves cancels it.

    With n > 1 the choices' chunks interleave, each naming its choice's `index`."""
    chat = answer.endpoint == "chat"

    def data(value: dict) -> dict:
        return {"data": json.dumps(value, ensure_ascii=False)}

    def logprobs(choice: _Choice, text: str) -> dict:
        if not answer.with_logprobs:
            return {}
        return {"logprobs": answer.logprobs(choice.unsent_logprobs(), len(choice.text) - len(text))}

    async def chunks():
        outcome = "cancelled"
        try:
            if chat:
                for choice in answer.choices:
                    role = {"role": "assistant", "content": ""}
                    yield data(answer.chunk({"index": choice.index, "delta": role, "finish_reason": None}))
            async for choice, event in answer.events():
                if event.text and not answer.plan.parse_tools:
                    delta = {"delta": {"content": event.text}} if chat else {"text": event.text}
                    extra = logprobs(choice, event.text)
                    yield data(answer.chunk({"index": choice.index, **delta, "finish_reason": None, **extra}))
                if event.finish_reason is None:
                    continue
                if chat:
                    message, reason = answer.message(choice)
                    delta = {}
                    if answer.plan.parse_tools:
                        delta = {k: v for k, v in message.items() if k != "role" and v is not None}
                        for index, call in enumerate(delta.get("tool_calls", [])):
                            call["index"] = index
                    last = {"index": choice.index, "delta": delta, "finish_reason": reason, **logprobs(choice, "")}
                else:
                    reason = finish_reason(choice.last)
                    last = {"index": choice.index, "text": "", "finish_reason": reason, **logprobs(choice, "")}
                yield data(answer.chunk(last))
            if include_usage:
                yield data(answer.chunk(None, with_usage=True))
            outcome = answer.outcome()
            yield {"data": "[DONE]"}
        except APIError as exc:
            yield data(error_body(exc.status, exc.message, exc.code))
        except Exception as exc:  # the stream has begun: the error goes into it
            log.exception("stream %s failed", answer.id)
            outcome = "failed"
            yield data(error_body(500, f"Generation failed: {exc}"))
        finally:
            answer.stop()
            answer.record(outcome)

    return _AnswerStream(answer, chunks())


class _AnswerStream(EventSourceResponse):
    """An event stream that cancels its answer however the response ends, even when the
    client left before the first event (the event generator then never runs)."""

    def __init__(self, answer: _Answer, chunks):
        super().__init__(chunks, ping=15, sep="\n")
        self.answer = answer

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.answer.stop()
            self.answer.record("cancelled")


def _encode_vector(vector: np.ndarray, encoding_format: str) -> list[float] | str:
    """A vector as OpenAI sends it: a list of floats, or base64 of its float32 little-endian bytes."""
    if encoding_format == "base64":
        return base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
    return [float(x) for x in vector]


def router(state: ServerState) -> APIRouter:
    """OpenAI's routes over `state`'s served model."""
    routes = APIRouter()

    @routes.get("/v1/models")
    async def models():
        served = state.require()
        return {
            "object": "list",
            "data": [
                {
                    "id": served.name,
                    "object": "model",
                    "created": served.created,
                    "owned_by": "sprig",
                    "context_length": served.n_ctx,
                }
            ],
        }

    async def respond(request: Request, body: ChatCompletionRequest | CompletionRequest, answer: _Answer):
        """A streamed answer (SSE), or the whole answer once it is complete."""
        if body.stream:
            return _stream(answer, bool(body.stream_options and body.stream_options.include_usage))
        return await _complete(request, answer)

    @routes.post("/v1/embeddings")
    async def embeddings(body: EmbeddingRequest):
        served = state.require()
        loaded = served.loaded
        texts = [body.input] if isinstance(body.input, str) else body.input
        try:
            how = pooling(loaded)
            token_lists = [embedding_tokens(loaded, text) for text in texts]
            for i, tokens in enumerate(token_lists):
                check_input(texts[i], tokens, served.n_ctx, f"input[{i}]" if isinstance(body.input, list) else "input")
        except EmbeddingError as exc:
            raise APIError(400, str(exc), param="input") from exc
        width = loaded.config.d_model
        if body.dimensions is not None and body.dimensions != width:
            raise APIError(
                400, f"This model's embeddings have {width} dimensions, not {body.dimensions}.", param="dimensions"
            )
        vectors = await on_scheduler(served, lambda: [embed_tokens(loaded, t, how) for t in token_lists])
        n_tokens = sum(map(len, token_lists))
        return {
            "object": "list",
            "data": [
                {"object": "embedding", "index": i, "embedding": _encode_vector(v, body.encoding_format)}
                for i, v in enumerate(vectors)
            ],
            "model": served.name,
            "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens},
        }

    @routes.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request):
        served = state.require()
        return await respond(request, body, _Answer(state, served, plan_chat(served, body), "chat"))

    @routes.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        served = state.require()
        return await respond(request, body, _Answer(state, served, plan_completion(served, body), "text"))

    return routes
