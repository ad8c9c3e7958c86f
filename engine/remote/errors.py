"""Every way a remote server can fail, as one line a person can act on (a `RemoteError`).

The client library's exceptions (openai's, and httpx2's mid-stream) are translated here
and nowhere else; the message names the server, says what happened and what to try.
"""

import ssl

import httpx2
import openai

from engine.errors import RemoteError


def _causes(exc: BaseException) -> list[BaseException]:
    """`exc` and the chain of exceptions that caused it."""
    chain: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in chain:
        chain.append(current)
        current = current.__cause__ or current.__context__
    return chain


def _server_message(exc: openai.APIStatusError) -> str:
    """The server's own words about a refused request, shortened, or ''."""
    body = exc.body
    if isinstance(body, dict):
        body = body.get("error", body)
        body = body.get("message", "") if isinstance(body, dict) else body
    text = " ".join(str(body or "").split())
    return f" The server said: {text[:200]}" if text else ""


def retry_after(response: httpx2.Response) -> float | None:
    """The Retry-After header in seconds (a number of seconds; dates are not used by these servers)."""
    value = response.headers.get("retry-after")
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None


def explain(exc: BaseException, server: str, model: str | None = None) -> RemoteError:
    """`exc`, raised while talking to `server` (its name or URL) about `model`, as a RemoteError."""
    if isinstance(exc, RemoteError):
        return exc
    chain = _causes(exc)
    if any(isinstance(e, ssl.SSLCertVerificationError) for e in chain):
        return RemoteError(
            f"{server}: its TLS certificate could not be verified ({_reason(chain, ssl.SSLCertVerificationError)}). "
            "If this is your own server with a self-signed certificate, tick “Accept a self-signed certificate” "
            "for it in Settings → Models."
        )
    if any(isinstance(e, ssl.SSLError) for e in chain):
        return RemoteError(f"{server}: the TLS handshake failed ({_reason(chain, ssl.SSLError)}). Check http vs https.")
    if isinstance(exc, openai.APIStatusError):
        return _status_error(exc, server, model)
    if isinstance(exc, openai.APITimeoutError | httpx2.TimeoutException) or any(
        isinstance(e, httpx2.TimeoutException) for e in chain
    ):
        return RemoteError(f"{server} stopped answering (no data within the time limit). Try again, or check it.")
    if any(isinstance(e, ConnectionRefusedError) for e in chain):
        return RemoteError(f"{server} refused the connection: nothing is listening there. Is the server running?")
    if isinstance(exc, httpx2.RemoteProtocolError | httpx2.ReadError) or any(
        isinstance(e, httpx2.RemoteProtocolError | httpx2.ReadError) for e in chain
    ):
        return RemoteError(f"{server} closed the connection in the middle of the answer.")
    if isinstance(exc, openai.APIConnectionError) or any(isinstance(e, httpx2.ConnectError) for e in chain):
        return RemoteError(
            f"{server} cannot be reached ({_reason(chain, OSError) or 'connection failed'}). Check the address."
        )
    if isinstance(exc, openai.APIError):
        return RemoteError(f"{server} reported an error: {exc.message}")
    return RemoteError(f"{server}: {type(exc).__name__}: {exc}")


def _reason(chain: list[BaseException], kind: type[BaseException]) -> str:
    """The innermost message of an exception of `kind` in the chain."""
    found = [e for e in chain if isinstance(e, kind)]
    if not found:
        return ""
    inner = found[-1]
    return str(getattr(inner, "verify_message", None) or getattr(inner, "strerror", None) or inner)


def _status_error(exc: openai.APIStatusError, server: str, model: str | None) -> RemoteError:
    status, said = exc.status_code, _server_message(exc)
    if status in (401, 403):
        return RemoteError(f"{server} refused the API key (HTTP {status}). Check the key in Settings → Models.{said}")
    if status == 404:
        what = f"has no model “{model}”" if model else "has no OpenAI API at this address"
        return RemoteError(f"{server} {what} (HTTP 404). Check the base URL (it ends in /v1) and the model.{said}")
    if status == 429:
        wait = retry_after(exc.response)
        when = f"try again in {wait:g} s" if wait is not None else "try again later"
        return RemoteError(f"{server} is rate-limiting requests (HTTP 429): {when}.{said}", retry_after=wait)
    if status >= 500:
        return RemoteError(f"{server} failed with a server error (HTTP {status}). Try again later.{said}")
    return RemoteError(f"{server} rejected the request (HTTP {status}).{said}")
