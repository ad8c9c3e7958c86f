"""The FastAPI application: OpenAI's routes over the scheduler, behind the security middleware.

`create_app(state, config)` builds one; `ServerState.served` is None while the model
loads (generation routes and /health answer 503 then).
"""

import asyncio
import json
import logging
import time
import uuid
from dataclasses import dataclass, field

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from sse_starlette import EventSourceResponse
from starlette.middleware.cors import CORSMiddleware
from starlette.middleware.trustedhost import TrustedHostMiddleware

from engine.generation import GenerationEvent
from engine.server.completions import (
    Generation,
    Plan,
    ServedModel,
    finish_reason,
    plan_chat,
    plan_completion,
    usage,
)
from engine.server.errors import APIError, error_body, install_error_handlers
from engine.server.metrics import ServerMetrics
from engine.server.schemas import (
    ChatCompletionRequest,
    CompletionRequest,
    TokenizeRequest,
)
from engine.server.security import (
    ApiKeyMiddleware,
    BodyLimitMiddleware,
    RequestIdMiddleware,
    allowed_hosts,
)
from engine.server.tool_calls import parse_tool_calls

log = logging.getLogger("sprig.server")

MAX_BODY_BYTES = 4 * 2**20


@dataclass
class ServerConfig:
    """How the server listens and whom it lets in."""

    host: str = "127.0.0.1"
    port: int = 8080
    api_key: str | None = None
    cors_origins: list[str] = field(default_factory=list)
    max_body_bytes: int = MAX_BODY_BYTES


class ServerState:
    """What the routes serve: the model (None while loading) and the request counters."""

    def __init__(self, served: ServedModel | None = None):
        self.served = served
        self.metrics = ServerMetrics(lambda: self.served.scheduler if self.served else None)
        self.requests_total = 0  # generation requests received (the app's panel shows it)

    def require(self) -> ServedModel:
        """The served model, or APIError 503 while it loads."""
        served = self.served
        if served is None:
            raise APIError(
                503, "The model is still loading; retry shortly.", code="model_loading", headers={"Retry-After": "5"}
            )
        return served


async def _watch_disconnect(request: Request, generation: Generation) -> None:
    """Cancel `generation` when the client goes away (for answers that are not streamed)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            generation.stop()
            return


class _Answer:
    """One answer being produced: its ids, the events seen, and the metrics it leaves behind."""

    def __init__(self, state: ServerState, served: ServedModel, plan: Plan, endpoint: str):
        self.state, self.served, self.plan, self.endpoint = state, served, plan, endpoint
        self.id = f"{'chatcmpl' if endpoint == 'chat' else 'cmpl'}-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.text = ""
        self.last: GenerationEvent | None = None
        self.generation = Generation(served, plan)
        self._recorded = False
        state.requests_total += 1
        try:
            self.generation.start()
        except APIError:
            state.metrics.requests.labels(endpoint, "refused").inc()
            raise

    async def events(self):
        async for event in self.generation.events():
            self.text += event.text
            self.last = event
            yield event

    def record(self, outcome: str) -> None:
        """Count the answer in the metrics (once; later calls do nothing)."""
        if self._recorded:
            return
        self._recorded = True
        metrics = self.state.metrics
        metrics.requests.labels(self.endpoint, outcome).inc()
        ticket = self.generation.ticket
        if ticket.started is not None:
            metrics.queue_wait.observe(ticket.started - ticket.enqueued)
        if self.last is None:
            return
        m = self.last.metrics
        metrics.prompt_tokens.inc(len(self.plan.prompt))
        metrics.cached_tokens.inc(len(self.plan.prompt) - m.prefill_tokens)
        metrics.generated_tokens.inc(m.decode_tokens)
        if m.time_to_first_token is not None:
            metrics.ttft.observe(m.time_to_first_token)
        if m.decode_tokens_per_second is not None:
            metrics.tokens_per_second.set(m.decode_tokens_per_second)

    def outcome(self) -> str:
        return "completed" if self.last is not None and finish_reason(self.last) else "cancelled"

    def message(self) -> tuple[dict, str | None]:
        """The assistant message and the finish reason, tool calls parsed out when asked for."""
        reason = finish_reason(self.last) if self.last else None
        if self.plan.parse_tools:
            content, calls = parse_tool_calls(self.text, self.served.call_style)
            if calls:
                return {
                    "role": "assistant",
                    "content": content,
                    "tool_calls": [c.as_openai() for c in calls],
                }, "tool_calls"
        return {"role": "assistant", "content": self.text}, reason

    def chunk(self, choice: dict | None, with_usage: bool = False) -> dict:
        kind = "chat.completion.chunk" if self.endpoint == "chat" else "text_completion"
        out = {
            "id": self.id,
            "object": kind,
            "created": self.created,
            "model": self.served.name,
            "choices": [] if choice is None else [{"index": 0, "logprobs": None, **choice}],
        }
        if with_usage:
            out["usage"] = usage(self.plan, self.last)
        return out


async def _complete(request: Request, answer: _Answer) -> JSONResponse:
    """Run an answer to its end and send it whole; a client that leaves cancels it."""
    watcher = asyncio.create_task(_watch_disconnect(request, answer.generation))
    try:
        async for _ in answer.events():
            pass
    finally:
        watcher.cancel()
        answer.record(answer.outcome())
    if answer.endpoint == "chat":
        message, reason = answer.message()
        choice = {"index": 0, "message": message, "finish_reason": reason, "logprobs": None}
        kind = "chat.completion"
    else:
        choice = {"index": 0, "text": answer.text, "finish_reason": finish_reason(answer.last), "logprobs": None}
        kind = "text_completion"
    return JSONResponse(
        {
            "id": answer.id,
            "object": kind,
            "created": answer.created,
            "model": answer.served.name,
            "choices": [choice],
            "usage": usage(answer.plan, answer.last),
        }
    )


def _stream(answer: _Answer, include_usage: bool) -> EventSourceResponse:
    """Send an answer as server-sent events, ending in [DONE]; a client that leaves cancels it."""
    chat = answer.endpoint == "chat"

    def data(value: dict) -> dict:
        return {"data": json.dumps(value, ensure_ascii=False)}

    async def chunks():
        outcome = "cancelled"
        try:
            if chat:
                yield data(answer.chunk({"delta": {"role": "assistant", "content": ""}, "finish_reason": None}))
            async for event in answer.events():
                if event.text and not answer.plan.parse_tools:
                    delta = {"delta": {"content": event.text}} if chat else {"text": event.text}
                    yield data(answer.chunk({**delta, "finish_reason": None}))
            if chat:
                message, reason = answer.message()
                delta = {}
                if answer.plan.parse_tools:
                    delta = {k: v for k, v in message.items() if k != "role" and v is not None}
                    for index, call in enumerate(delta.get("tool_calls", [])):
                        call["index"] = index
                yield data(answer.chunk({"delta": delta, "finish_reason": reason}))
            else:
                yield data(answer.chunk({"text": "", "finish_reason": finish_reason(answer.last)}))
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
            answer.generation.stop()
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
            self.answer.generation.stop()
            self.answer.record("cancelled")


def create_app(state: ServerState, config: ServerConfig) -> FastAPI:
    """The server's ASGI application, with its middleware (outermost first: request id,
    Host check, CORS, body limit, API key)."""
    app = FastAPI(title="Sprig", version="1", docs_url=None, redoc_url=None)
    install_error_handlers(app)

    @app.get("/health")
    async def health():
        if state.served is None:
            return JSONResponse({"status": "loading"}, status_code=503, headers={"Retry-After": "5"})
        return {"status": "ok"}

    @app.get("/v1/models")
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

    @app.get("/metrics")
    async def metrics():
        return Response(state.metrics.text(), media_type="text/plain; version=0.0.4")

    @app.post("/tokenize")
    async def tokenize(body: TokenizeRequest):
        tokenizer = state.require().loaded.tokenizer
        add_bos = body.add_special and tokenizer.bos_id is not None
        return {"tokens": tokenizer.encode(body.content, add_bos=add_bos, parse_special=body.parse_special)}

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request):
        served = state.require()
        answer = _Answer(state, served, plan_chat(served, body), "chat")
        if body.stream:
            return _stream(answer, bool(body.stream_options and body.stream_options.include_usage))
        return await _complete(request, answer)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        served = state.require()
        answer = _Answer(state, served, plan_completion(served, body), "text")
        if body.stream:
            return _stream(answer, bool(body.stream_options and body.stream_options.include_usage))
        return await _complete(request, answer)

    if config.api_key:
        app.add_middleware(ApiKeyMiddleware, api_key=config.api_key)
    app.add_middleware(BodyLimitMiddleware, limit=config.max_body_bytes)
    if config.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=config.cors_origins,
            allow_methods=["GET", "POST"],
            allow_headers=["Authorization", "Content-Type", "X-Request-Id"],
            expose_headers=["X-Request-Id"],
        )
    app.add_middleware(TrustedHostMiddleware, allowed_hosts=allowed_hosts(config.host))
    app.add_middleware(RequestIdMiddleware)
    return app
