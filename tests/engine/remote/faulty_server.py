"""A small loopback HTTP server that plays the servers that misbehave, one per base URL path.

`http://127.0.0.1:PORT/<mode>/v1` answers /models and /chat/completions as `mode` says:
"reasoning" (reasoning_content deltas, then the answer), "think" (<think> inside content),
"401", "404", "429" (Retry-After: 7), "500", "cut" (two chunks, then the connection drops
mid-body), "hang" (one chunk, then silence). `tls=True` serves HTTPS with a self-signed
certificate made by `openssl`.
"""

import json
import ssl
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

HANG_SECONDS = 30


def _chunk(delta: dict, finish: str | None = None) -> bytes:
    body = {"id": "x", "object": "chat.completion.chunk", "created": 0, "model": "m"}
    body["choices"] = [{"index": 0, "delta": delta, "finish_reason": finish}]
    return f"data: {json.dumps(body)}\n\n".encode()


USAGE = b'data: {"id":"x","object":"chat.completion.chunk","created":0,"model":"m","choices":[],' + (
    b'"usage":{"prompt_tokens":5,"completion_tokens":4,"total_tokens":9}}\n\n'
)
STREAMS = {
    "reasoning": [
        _chunk({"role": "assistant", "reasoning_content": "Let me "}),
        _chunk({"reasoning_content": "think."}),
        _chunk({"content": "The answer"}),
        _chunk({"content": " is 4."}, "stop"),
        USAGE,
        b"data: [DONE]\n\n",
    ],
    "think": [
        _chunk({"role": "assistant", "content": "<think>hmm</think>"}),
        _chunk({"content": "Four."}, "stop"),
        b"data: [DONE]\n\n",
    ],
    "cut": [_chunk({"role": "assistant", "content": "Half an "}), _chunk({"content": "answer"})],
    "hang": [_chunk({"role": "assistant", "content": "Waiting"})],
}
ERRORS = {
    "401": (401, {}, "Invalid API key"),
    "404": (404, {}, "The model `m` does not exist"),
    "429": (429, {"Retry-After": "7"}, "Rate limit reached"),
    "500": (500, {}, "CUDA out of memory"),
}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:  # quiet
        pass

    def _mode(self) -> str:
        return self.path.strip("/").split("/")[0]

    def do_GET(self) -> None:
        mode = self._mode()
        if mode in ERRORS:
            self._error(*ERRORS[mode])
        else:
            self._json(200, {"object": "list", "data": [{"id": "m", "object": "model", "owned_by": "test"}]})

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        mode = self._mode()
        if mode in ERRORS:
            self._error(*ERRORS[mode])
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for piece in STREAMS[mode]:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            self.wfile.flush()
        if mode == "hang":
            time.sleep(HANG_SECONDS)
        if mode in ("cut", "hang"):
            self.close_connection = True
            return  # no closing 0-chunk: the body ends in the middle
        self.wfile.write(b"0\r\n\r\n")

    def _json(self, status: int, body: dict, headers: dict | None = None) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _error(self, status: int, headers: dict, message: str) -> None:
        self._json(status, {"error": {"message": message, "type": "error"}}, headers)


def self_signed_context(folder: Path) -> ssl.SSLContext:
    """A server TLS context with a fresh self-signed certificate for 127.0.0.1."""
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    return context


class FaultyServer:
    """The server on a free loopback port, in a thread; `url(mode)` is a base URL."""

    def __init__(self, tls: ssl.SSLContext | None = None):
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self.httpd.daemon_threads = True
        if tls is not None:
            self.httpd.socket = tls.wrap_socket(self.httpd.socket, server_side=True)
        self.scheme = "https" if tls else "http"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def url(self, mode: str) -> str:
        return f"{self.scheme}://127.0.0.1:{self.httpd.server_address[1]}/{mode}/v1"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
