"""The server's guards, as plain ASGI middleware (they must not buffer streamed answers).

- `check_bind`: only loopback without an API key.
- `allowed_hosts`: the Host header names this machine, against DNS rebinding (checked by
  Starlette's TrustedHostMiddleware).
- `ApiKeyMiddleware`: `Authorization: Bearer KEY`, compared in constant time.
- `BodyLimitMiddleware`: a body over the limit gets 413 before it is read in full.
- `RequestIdMiddleware`: every response carries `X-Request-Id` (the client's, or a new one),
  and the access log names it.
"""

import hmac
import ipaddress
import json
import logging
import re
import uuid

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from engine.server.errors import error_body

log = logging.getLogger("sprig.server")

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "[::1]")
OPEN_PATHS = ("/health",)  # answered without a key: a readiness probe reveals nothing
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:\-]{1,128}$")


def is_loopback(host: str) -> bool:
    """Whether `host` (a name or an address) only reaches this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_bind(host: str, api_key: str | None) -> None:
    """Raise ValueError (one line) when binding `host` without a key would expose the model."""
    if not is_loopback(host) and not api_key:
        raise ValueError(
            f"refusing to listen on {host} without --api-key: anyone on the network could use "
            "the model. Pass --api-key, or keep the default --host 127.0.0.1."
        )


def allowed_hosts(host: str) -> list[str]:
    """Host header values to accept: the loopback names plus the bound address.

    Bound to every address ("0.0.0.0", "::"), the server cannot know the names it is
    reached by, so any Host passes; `check_bind` has then required an API key, which a
    page that rebinds a name to this machine does not have.
    """
    if host in ("0.0.0.0", "::", "[::]"):
        return ["*"]
    bound = f"[{host}]" if ":" in host and not host.startswith("[") else host
    return list(LOOPBACK_NAMES) + ([bound] if bound not in LOOPBACK_NAMES else [])


async def _send_error(send: Send, status: int, message: str, headers: list | None = None) -> None:
    body = json.dumps(error_body(status, message)).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *(headers or []),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


class ApiKeyMiddleware:
    """Refuses requests without the right bearer key (401), except on OPEN_PATHS."""

    def __init__(self, app: ASGIApp, api_key: str):
        self.app = app
        self.expected = f"Bearer {api_key}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            return await self.app(scope, receive, send)
        given = Headers(scope=scope).get("authorization", "").encode("latin-1")
        if not hmac.compare_digest(given, self.expected):
            return await _send_error(
                send,
                401,
                "Missing or wrong API key: send 'Authorization: Bearer KEY'.",
                [(b"www-authenticate", b"Bearer")],
            )
        await self.app(scope, receive, send)


class BodyLimitMiddleware:
    """Answers 413 to a body over `limit` bytes, by its Content-Length or as it streams in.

    A streamed body that grows too large gets the 413 at once; the application then sees
    the client as gone, and whatever it still tries to send is dropped.
    """

    def __init__(self, app: ASGIApp, limit: int):
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = Headers(scope=scope).get("content-length")
        if length is not None and (not length.isdigit() or int(length) > self.limit):
            return await _send_error(send, 413, f"The request body is larger than {self.limit} bytes.")
        received = 0
        started = refused = False

        async def counting_receive() -> Message:
            nonlocal received, refused
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.limit and not started:
                    refused = True
                    await _send_error(send, 413, f"The request body is larger than {self.limit} bytes.")
                    return {"type": "http.disconnect"}
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if refused:
                return
            started = started or message["type"] == "http.response.start"
            await send(message)

        await self.app(scope, counting_receive, tracking_send)


class RequestIdMiddleware:
    """Echoes a well-formed `X-Request-Id` or makes one; logs each request with it."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        given = Headers(scope=scope).get("x-request-id", "")
        request_id = given if _REQUEST_ID.match(given) else uuid.uuid4().hex
        headers = [(k, v) for k, v in scope["headers"] if k != b"x-request-id"]
        scope = {**scope, "headers": [*headers, (b"x-request-id", request_id.encode())]}

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), (b"x-request-id", request_id.encode())]}
                log.info("%s %s %s -> %s", request_id, scope["method"], scope["path"], message["status"])
            await send(message)

        await self.app(scope, receive, send_with_id)
