"""Auth, the Host check against DNS rebinding, CORS, the bind rule and request ids, each for and against."""

import subprocess
import sys

import httpx2 as httpx
import pytest

from engine.server.app import ServerConfig, ServerState
from engine.server.security import allowed_hosts, check_bind
from engine.server.serve import BackgroundServer
from tests.engine.server.conftest import running_server


@pytest.fixture(scope="module")
def guarded(tiny_model_path):
    with running_server(tiny_model_path, api_key="s3cret", cors_origins=["http://allowed.example"]) as server:
        yield server.url.removesuffix("/v1")


def test_api_key_is_required_and_checked(guarded):
    assert httpx.get(f"{guarded}/v1/models").status_code == 401
    wrong = httpx.get(f"{guarded}/v1/models", headers={"Authorization": "Bearer s3cre"})
    assert wrong.status_code == 401 and wrong.json()["error"]["type"] == "authentication_error"
    assert httpx.get(f"{guarded}/v1/models", headers={"Authorization": "Bearer s3cret"}).status_code == 200
    assert httpx.get(f"{guarded}/health").status_code == 200  # the readiness probe needs no key


@pytest.mark.parametrize("host", ["evil.example", "evil.example:8080", "192.168.1.5", "localhost.evil.example"])
def test_foreign_host_header_is_refused(guarded, host):
    reply = httpx.get(f"{guarded}/health", headers={"Host": host})
    assert reply.status_code == 400


@pytest.mark.parametrize("host", ["localhost", "localhost:8080", "127.0.0.1:1234", "[::1]:8080"])
def test_loopback_host_header_is_accepted(guarded, host):
    assert httpx.get(f"{guarded}/health", headers={"Host": host}).status_code == 200


def test_cors_lets_in_only_listed_origins(guarded):
    preflight = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "authorization"}
    allowed = httpx.options(f"{guarded}/v1/chat/completions", headers={"Origin": "http://allowed.example", **preflight})
    assert allowed.status_code == 200
    assert allowed.headers["access-control-allow-origin"] == "http://allowed.example"
    other = httpx.options(f"{guarded}/v1/chat/completions", headers={"Origin": "http://evil.example", **preflight})
    assert "access-control-allow-origin" not in other.headers
    simple = httpx.get(f"{guarded}/health", headers={"Origin": "http://evil.example"})
    assert "access-control-allow-origin" not in simple.headers


def test_cors_is_off_by_default(tiny_server):
    base = tiny_server.url.removesuffix("/v1")
    reply = httpx.get(f"{base}/health", headers={"Origin": "http://localhost:3000"})
    assert reply.status_code == 200 and "access-control-allow-origin" not in reply.headers


def test_request_id_is_echoed_or_made(tiny_server):
    base = tiny_server.url.removesuffix("/v1")
    assert httpx.get(f"{base}/health", headers={"X-Request-Id": "abc-123"}).headers["x-request-id"] == "abc-123"
    made = httpx.get(f"{base}/nowhere").headers["x-request-id"]
    assert len(made) == 32 and made != httpx.get(f"{base}/nowhere").headers["x-request-id"]
    assert httpx.get(f"{base}/health", headers={"X-Request-Id": "bad id\t<x>"}).headers["x-request-id"] != "bad id\t<x>"


def test_host_names_follow_the_bound_address():
    assert allowed_hosts("127.0.0.1") == ["localhost", "127.0.0.1", "[::1]"]
    assert allowed_hosts("192.168.1.5") == ["localhost", "127.0.0.1", "[::1]", "192.168.1.5"]
    assert allowed_hosts("fe80::1") == ["localhost", "127.0.0.1", "[::1]", "[fe80::1]"]
    assert allowed_hosts("0.0.0.0") == ["*"]  # reached by names it cannot know; the key guards it


def test_binding_beyond_loopback_needs_a_key():
    for host in ("127.0.0.1", "localhost", "::1", "127.0.0.2"):
        check_bind(host, None)
    check_bind("0.0.0.0", "key")
    for host in ("0.0.0.0", "192.168.1.5", "::"):
        with pytest.raises(ValueError, match="--api-key"):
            check_bind(host, None)


def test_serve_command_refuses_an_open_bind_in_one_line(tiny_model_path):
    result = subprocess.run([sys.executable, "-m", "engine", "serve", "--model", str(tiny_model_path),
                             "--host", "0.0.0.0"], check=False, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "--api-key" in result.stderr


def test_while_loading_health_and_generation_answer_503():
    server = BackgroundServer(ServerState(), ServerConfig(port=0)).start()
    try:
        base = server.url.removesuffix("/v1")
        health = httpx.get(f"{base}/health")
        assert health.status_code == 503 and health.headers["retry-after"]
        reply = httpx.post(f"{base}/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
        assert reply.status_code == 503 and reply.json()["error"]["code"] == "model_loading"
        assert reply.headers["retry-after"]
    finally:
        server.stop()
