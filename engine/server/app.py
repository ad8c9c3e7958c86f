"""The FastAPI application: each protocol's routes over the one scheduler, behind the
security middleware.

`create_app(state, config)` builds one; `ServerState.served` is None while the model
loads (generation routes and /health answer 503 then). The protocols are sibling modules,
each a `router(state)` included here: `engine.server.openai` (OpenAI's /v1 routes); the
routes that belong to no protocol (/health, /metrics, /tokenize) are here.
"""

from dataclasses import dataclass, field

from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response
from starlette.middleware.cors import CORSMiddleware
from starlette.middleware.trustedhost import TrustedHostMiddleware

from engine.server import openai
from engine.server.errors import install_error_handlers
from engine.server.schemas import TokenizeRequest
from engine.server.security import (
    ApiKeyMiddleware,
    BodyLimitMiddleware,
    RequestIdMiddleware,
    allowed_hosts,
)
from engine.server.state import ServerState

MAX_BODY_BYTES = 4 * 2**20


@dataclass
class ServerConfig:
    """How the server listens and whom it lets in."""

    host: str = "127.0.0.1"
    port: int = 8080
    api_key: str | None = None
    cors_origins: list[str] = field(default_factory=list)
    max_body_bytes: int = MAX_BODY_BYTES


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

    @app.get("/metrics")
    async def metrics():
        return Response(state.metrics.text(), media_type="text/plain; version=0.0.4")

    @app.post("/tokenize")
    async def tokenize(body: TokenizeRequest):
        tokenizer = state.require().loaded.tokenizer
        add_bos = body.add_special and tokenizer.bos_id is not None
        return {"tokens": tokenizer.encode(body.content, add_bos=add_bos, parse_special=body.parse_special)}

    app.include_router(openai.router(state))

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
