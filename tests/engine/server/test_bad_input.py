"""Hostile and broken requests: each gets a clean 4xx in OpenAI's error format, and the server stays up."""

import socket

import httpx2 as httpx
import pytest

GOOD = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


@pytest.fixture(scope="module")
def base(tiny_server):
    return tiny_server.url.removesuffix("/v1")


def post(base, body=None, content=None, headers=None):
    return httpx.post(f"{base}/v1/chat/completions", json=body, content=content, headers=headers, timeout=30)


def assert_clean(reply, status=400):
    assert reply.status_code == status, reply.text
    error = reply.json()["error"]
    assert error["message"] and error["type"]


@pytest.mark.parametrize("body", [
    {**GOOD, "max_tokens": "many"},
    {**GOOD, "max_tokens": "12"},
    {**GOOD, "max_tokens": 2.5},
    {**GOOD, "stream": "yes"},
    {**GOOD, "stream": 1},
    {**GOOD, "messages": "hi"},
    {**GOOD, "messages": [{"role": "user", "content": 5}]},
    {**GOOD, "messages": [{"role": "wizard", "content": "hi"}]},
    {**GOOD, "temperature": -1},
    {**GOOD, "max_tokens": -5},
    {**GOOD, "max_tokens": 0},
    {**GOOD, "max_tokens": 10**30},
    {**GOOD, "top_p": 1e308},
    {**GOOD, "top_k": -1},
    {**GOOD, "seed": -1},
    {**GOOD, "seed": 2**70},
    {**GOOD, "stop": ["x"] * 1000},
    {**GOOD, "n": 9},
    {**GOOD, "n": 0},
    {**GOOD, "logit_bias": {"5": 101}},
    {**GOOD, "logit_bias": {"5": -100.5}},
    {**GOOD, "logit_bias": {"abc": 1}},
    {**GOOD, "logit_bias": {"99999999": 1}},
    {**GOOD, "logit_bias": {"5": "1"}},
    {**GOOD, "top_logprobs": 3},
    {**GOOD, "logprobs": True, "top_logprobs": 21},
    {**GOOD, "logprobs": 2},
    {**GOOD, "frobnicate": True},
    {**GOOD, "messages": [{"role": "user", "content": "hi", "colour": "red"}]},
    {**GOOD, "messages": []},
    {"max_tokens": 2},
    {**GOOD, "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}}},
    {**GOOD, "tools": [{"type": "function", "function": {"name": "bad name!"}}]},
    {**GOOD, "continue_final_message": True, "add_generation_prompt": False},  # the last message is the user's
    {**GOOD, "messages": [{"role": "assistant", "content": "Once"}], "continue_final_message": True},
    [1, 2, 3],
])
def test_bad_fields_get_400(base, body):
    assert_clean(post(base, body))
    assert httpx.get(f"{base}/health").status_code == 200


def test_unknown_field_is_named(base):
    assert "frobnicate" in post(base, {**GOOD, "frobnicate": 1}).json()["error"]["message"]


@pytest.mark.parametrize("content", [b"{not json", b"", b'{"messages": [{"role": "user", "content": "\xff\xfe"}]}',
                                     b"\x00\x01\x02", b'"just a string"'])
def test_malformed_bodies_get_400(base, content):
    assert_clean(post(base, content=content, headers={"Content-Type": "application/json"}))


def test_ten_megabyte_body_gets_413(base):
    assert_clean(post(base, content=b"x" * 10 * 2**20, headers={"Content-Type": "application/json"}), 413)


def test_ten_megabyte_chunked_body_gets_413(base):
    def chunks():
        for _ in range(10):
            yield b" " * 2**20
    assert_clean(post(base, content=chunks(), headers={"Content-Type": "application/json"}), 413)
    assert httpx.get(f"{base}/health").status_code == 200


def test_unknown_route_and_method(base):
    assert_clean(httpx.get(f"{base}/v1/nowhere"), 404)
    assert_clean(httpx.get(f"{base}/v1/chat/completions"), 405)


def test_tokenize_refuses_bad_input(base):
    assert_clean(httpx.post(f"{base}/tokenize", json={"content": 5}))
    assert httpx.post(f"{base}/tokenize", json={"content": "hi"}).json()["tokens"]


def test_garbage_on_the_socket_leaves_the_server_up(base):
    host, port = base.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=5) as raw:
        raw.sendall(b"\x16\x03\x01 not http at all\r\n\r\n")
        raw.recv(1024)
    assert httpx.get(f"{base}/health").status_code == 200
