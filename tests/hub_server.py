"""A loopback stand-in for the Hugging Face Hub, for tests that must never touch the network.

Importing this module reserves a port on 127.0.0.1 and points `HF_ENDPOINT` at it (and
the cache, token and telemetry settings at harmless places) *before* `huggingface_hub`
is imported, which reads them once. `tests/conftest.py` imports it first thing.

It plays the routes `huggingface_hub` calls, as read in its source (2.x):

- `GET /api/models?search=&filter=gguf&sort=downloads&limit=&expand=`: the search;
- `GET /api/models/{repo}[/revision/{rev}]?blobs=true`: one repository, every file with
  its size, blob id and LFS SHA-256;
- `HEAD|GET /{repo}/resolve/{rev}/{path}`: a file, with `Range` (206 and Content-Range),
  `ETag`, `X-Linked-Etag`, `X-Linked-Size` and `X-Repo-Commit`; gated repositories
  answer 401 with `X-Error-Code: GatedRepo` unless the right token comes.

Faults a test can ask for: statuses to answer before succeeding (`fail`), a connection
dropped after some bytes (`drop_after`), wrong bytes under the right checksum
(`corrupt`), a slower body (`chunk_delay_s`). Every request is logged in `requests`.
"""

import hashlib
import json
import os
import socket
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit

assert "huggingface_hub" not in sys.modules, "huggingface_hub was imported before HF_ENDPOINT was set"

_SOCKET = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
_SOCKET.bind(("127.0.0.1", 0))
_SOCKET.listen(64)
ENDPOINT = f"http://127.0.0.1:{_SOCKET.getsockname()[1]}"
os.environ["HF_ENDPOINT"] = ENDPOINT
os.environ["HF_HUB_CACHE"] = tempfile.mkdtemp(prefix="sprig-hf-cache-")  # never the user's cache
os.environ["HF_TOKEN_PATH"] = os.path.join(os.environ["HF_HUB_CACHE"], "no-token")
os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"
os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_OFFLINE", "HF_HOME"):
    os.environ.pop(name, None)

BODY_PIECE = 32 * 1024  # the server writes bodies in pieces this size


@dataclass
class FakeRepo:
    """One repository: its files, and who may read them."""

    files: dict[str, bytes]
    downloads: int = 0
    likes: int = 0
    license: str = "apache-2.0"
    token: str | None = None  # gated: files need `Authorization: Bearer <token>`
    gguf: dict = field(default_factory=dict)  # the Hub's summary of its GGUF files
    sizes: dict[str, int] = field(default_factory=dict)  # sizes to announce instead of the real ones

    @property
    def commit(self) -> str:
        """A 40-hex commit id that changes with the content."""
        digest = hashlib.sha1()
        for path, data in sorted(self.files.items()):
            digest.update(path.encode() + hashlib.sha256(data).digest())
        return digest.hexdigest()


@dataclass
class FakeHub:
    """The server's state: repositories, faults to play, requests seen."""

    repos: dict[str, FakeRepo] = field(default_factory=dict)
    fail: dict[str, list[int]] = field(default_factory=dict)  # route kind -> statuses to answer first
    drop_after: dict[str, int] = field(default_factory=dict)  # file path -> bytes before the connection drops
    corrupt: set[str] = field(default_factory=set)  # file paths served with one byte changed
    chunk_delay_s: float = 0.0
    requests: list[tuple[str, str, dict]] = field(default_factory=list)  # (method, path, lower-cased headers)

    def reset(self) -> None:
        """Forget repositories, faults and requests."""
        self.__init__()  # type: ignore[misc]

    def file_requests(self, path: str) -> list[dict]:
        """Headers of the GET requests for a file (by its path in the repository)."""
        return [h for m, p, h in self.requests if m == "GET" and "/resolve/" in p and p.endswith("/" + path)]


STATE = FakeHub()


def lfs_sha256(data: bytes) -> str:
    """The SHA-256 the Hub records for a file in LFS."""
    return hashlib.sha256(data).hexdigest()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format, *args):  # quiet
        pass

    def do_HEAD(self):
        self._route(body=False)

    def do_GET(self):
        self._route(body=True)

    def _route(self, body: bool) -> None:
        url = urlsplit(self.path)
        path, query = unquote(url.path), parse_qs(url.query)
        STATE.requests.append((self.command, path, {k.lower(): v for k, v in self.headers.items()}))
        if path == "/api/models":
            return self._fault("search") or self._search(query)
        if path.startswith("/api/models/"):
            repo_id = "/".join(path.removeprefix("/api/models/").split("/")[:2])
            return self._fault("info") or self._info(repo_id)
        parts = path.lstrip("/").split("/", 4)
        if len(parts) == 5 and parts[2] == "resolve":
            return self._fault("resolve") or self._resolve(f"{parts[0]}/{parts[1]}", parts[4], body)
        return self._send(404, b'{"error": "no such route"}')

    def _fault(self, kind: str) -> bool:
        statuses = STATE.fail.get(kind)
        if not statuses:
            return False
        status = statuses.pop(0)
        self._send(status, json.dumps({"error": f"fault {status}"}).encode())
        return True

    def _send(self, status: int, data: bytes, headers: dict | None = None, body: bool = True) -> None:
        self.send_response(status)
        headers = {"Content-Type": "application/json", "Content-Length": str(len(data)), **(headers or {})}
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        if body:
            self.wfile.write(data)

    def _missing_repo(self) -> None:
        self._send(404, b'{"error": "Repository not found"}', {"X-Error-Code": "RepoNotFound"})

    def _search(self, query: dict) -> None:
        needle = query.get("search", [""])[0].casefold()
        found = [(rid, r) for rid, r in STATE.repos.items() if needle in rid.casefold()]
        found.sort(key=lambda item: -item[1].downloads)
        limit = int(query.get("limit", ["1000"])[0])
        items = [
            {
                "id": rid,
                "downloads": r.downloads,
                "likes": r.likes,
                "lastModified": "2025-05-01T12:00:00.000Z",
                "tags": ["gguf", f"license:{r.license}"],
                "gated": "manual" if r.token else False,
            }
            for rid, r in found[:limit]
        ]
        self._send(200, json.dumps(items).encode())

    def _info(self, repo_id: str) -> None:
        repo = STATE.repos.get(repo_id)
        if repo is None:
            return self._missing_repo()
        siblings = []
        for name, data in sorted(repo.files.items()):
            size = repo.sizes.get(name, len(data))
            lfs = {"sha256": lfs_sha256(data), "size": size, "pointerSize": 134}
            siblings.append({"rfilename": name, "size": size, "blobId": hashlib.sha1(data).hexdigest(), "lfs": lfs})
        info = {
            "id": repo_id,
            "sha": repo.commit,
            "gated": "manual" if repo.token else False,
            "downloads": repo.downloads,
            "likes": repo.likes,
            "lastModified": "2025-05-01T12:00:00.000Z",
            "tags": ["gguf", f"license:{repo.license}"],
            "siblings": siblings,
            "gguf": repo.gguf,
        }
        self._send(200, json.dumps(info).encode())

    def _resolve(self, repo_id: str, name: str, body: bool) -> None:
        repo = STATE.repos.get(repo_id)
        if repo is None:
            return self._missing_repo()
        if repo.token and self.headers.get("Authorization") != f"Bearer {repo.token}":
            message = f"Access to model {repo_id} is restricted. You must have access to it and be authenticated."
            return self._send(401, b"{}", {"X-Error-Code": "GatedRepo", "X-Error-Message": message}, body)
        if name not in repo.files:
            return self._send(404, b"{}", {"X-Error-Code": "EntryNotFound", "X-Repo-Commit": repo.commit}, body)
        data = repo.files[name]
        if name in STATE.corrupt:
            data = bytes([data[0] ^ 0xFF]) + data[1:]
        etag = f'"{lfs_sha256(repo.files[name])}"'
        headers = {
            "Content-Type": "application/octet-stream",
            "ETag": etag,
            "X-Linked-Etag": etag,
            "X-Linked-Size": str(len(data)),
            "X-Repo-Commit": repo.commit,
            "Accept-Ranges": "bytes",
        }
        start, status = 0, 200
        ranged = self.headers.get("Range", "")
        if ranged.startswith("bytes=") and body:
            start, status = int(ranged.removeprefix("bytes=").split("-")[0]), 206
            headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
        piece = data[start:]
        self.send_response(status)
        headers["Content-Length"] = str(len(piece))
        for key, value in headers.items():
            self.send_header(key, value)
        self.end_headers()
        if body:
            self._stream(piece, STATE.drop_after.pop(name, None))

    def _stream(self, piece: bytes, drop_after: int | None) -> None:
        sent = 0
        while sent < len(piece):
            if drop_after is not None and sent >= drop_after:
                self.wfile.flush()
                self.connection.shutdown(socket.SHUT_RDWR)  # the connection drops half-way
                self.close_connection = True
                return
            end = min(sent + BODY_PIECE, len(piece), drop_after if drop_after is not None else len(piece))
            self.wfile.write(piece[sent:end])
            self.wfile.flush()
            sent = end
            if STATE.chunk_delay_s:
                threading.Event().wait(STATE.chunk_delay_s)


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):
        if not isinstance(sys.exc_info()[1], ConnectionError):  # a client that hung up (a pause) is no error
            super().handle_error(request, client_address)


_server: ThreadingHTTPServer | None = None


def start() -> FakeHub:
    """Serve on the reserved port (once per test session) and return the state, reset."""
    global _server
    if _server is None:
        _server = _Server(("127.0.0.1", 0), _Handler, bind_and_activate=False)
        _server.socket.close()
        _server.socket = _SOCKET
        threading.Thread(target=_server.serve_forever, name="fake-hub", daemon=True).start()
    STATE.reset()
    return STATE


def tiny_model_repo(folder) -> FakeRepo:
    """A repository of two real (tiny, random) Qwen3 GGUF files, F32 and Q8_0, written into `folder`."""
    from gguf import GGMLQuantizationType

    from tests.gguf_factory import write_tiny_model

    files = {}
    for quant in ("F32", "Q8_0"):
        path = write_tiny_model(
            f"{folder}/tiny-qwen3-{quant}.gguf", tensor_type=GGMLQuantizationType[quant], d_model=64, d_ff=128
        )
        files[path.name] = path.read_bytes()
    return FakeRepo(files, downloads=1234, likes=56, gguf={"total": 150_000, "architecture": "qwen3"})
