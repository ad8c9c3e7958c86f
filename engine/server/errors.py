"""Errors as OpenAI's clients expect them: `{"error": {message, type, param, code}}`.

Every failure, from a bad field to an unknown route, leaves the server through here with
a fitting status; nothing reaches the client as a stack trace.
"""

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

log = logging.getLogger("sprig.server")

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    503: "server_unavailable",
}


class APIError(Exception):
    """An error to send as OpenAI's error JSON with `status`."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        code: str | None = None,
        param: str | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.status, self.message, self.code, self.param = status, message, code, param
        self.headers = headers or {}


def error_body(status: int, message: str, code: str | None = None, param: str | None = None) -> dict:
    """OpenAI's error object."""
    return {"error": {"message": message, "type": _TYPES.get(status, "server_error"), "param": param, "code": code}}


def error_response(
    status: int, message: str, code: str | None = None, param: str | None = None, headers: dict[str, str] | None = None
) -> JSONResponse:
    """OpenAI's error JSON as a response."""
    return JSONResponse(error_body(status, message, code, param), status_code=status, headers=headers)


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    first = exc.errors()[0] if exc.errors() else {}
    location = [str(part) for part in first.get("loc", ()) if part != "body"]
    param = ".".join(location) or None
    if first.get("type") == "extra_forbidden":
        return f"Unsupported field: {param}", param
    if first.get("type") in ("json_invalid", "model_attributes_type") or not location:
        return "The request body is not a valid JSON object.", None
    return f"Invalid value for {param}: {first.get('msg', 'invalid')}", param


def install_error_handlers(app: FastAPI) -> None:
    """Make every error answer in OpenAI's format."""

    @app.exception_handler(APIError)
    async def api_error(request: Request, exc: APIError) -> JSONResponse:
        return error_response(exc.status, exc.message, exc.code, exc.param, exc.headers)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = _validation_message(exc)
        return error_response(400, message, "invalid_request", param)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        message = "Unknown route." if exc.status_code == 404 else str(exc.detail)
        return error_response(exc.status_code, message, headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("request %s failed", request.headers.get("x-request-id"))
        return error_response(500, f"Internal error: {type(exc).__name__}")
