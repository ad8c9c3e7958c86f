"""The official `openai` client, retries off, against the server on loopback (tiny random model).

The tiny model's text is noise, so these tests check the protocol: shapes, counts, stop
strings, finish reasons, constrained output, and the errors the client raises.
"""

import json
import threading
import time

import httpx2 as httpx
import jsonschema
import openai
import pytest

from engine.server.scheduler import SERVER, Ticket
from tests.engine.server.conftest import running_server

LONG = [{"role": "user", "content": "hello"}]  # the tiny model answers this greedily without ever stopping
# ChatML, written out by hand: the tiny model's template around LONG.
LONG_CHATML = "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def client(tiny_server):
    return openai.OpenAI(base_url=tiny_server.url, api_key="unused", max_retries=0, timeout=30)


def tokens_of(server, text: str) -> list[int]:
    reply = httpx.post(server.url.removesuffix("/v1") + "/tokenize", json={"content": text, "parse_special": True})
    assert reply.status_code == 200
    return reply.json()["tokens"]


def test_chat_answer_counts_its_tokens(client, tiny_server):
    reply = client.chat.completions.create(model="tiny", messages=LONG, max_tokens=12, temperature=0)
    choice = reply.choices[0]
    assert choice.finish_reason == "length" and choice.message.role == "assistant" and choice.message.content
    assert reply.usage.prompt_tokens == len(tokens_of(tiny_server, LONG_CHATML))
    assert reply.usage.completion_tokens == 12
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + 12
    assert reply.object == "chat.completion" and reply.id.startswith("chatcmpl-")


def test_stream_matches_the_whole_answer_and_ends_with_usage(client):
    whole = client.chat.completions.create(model="tiny", messages=LONG, max_tokens=20, temperature=0)
    chunks = list(client.chat.completions.create(model="tiny", messages=LONG, max_tokens=20, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[0].choices[0].delta.role == "assistant"
    finishing = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishing == ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 20
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens


def test_stream_without_include_usage_has_no_usage(client):
    chunks = list(client.chat.completions.create(model="tiny", messages=LONG, max_tokens=5, stream=True))
    assert all(c.usage is None for c in chunks) and all(c.choices for c in chunks)


def test_stop_string_ends_the_answer_before_it(client):
    free = client.chat.completions.create(model="tiny", messages=LONG, max_tokens=40, temperature=0)
    text = free.choices[0].message.content
    stop = text[10:13]  # three characters from the middle of the free answer
    stopped = client.chat.completions.create(model="tiny", messages=LONG, max_tokens=40, temperature=0, stop=[stop])
    assert stopped.choices[0].finish_reason == "stop"
    assert stopped.choices[0].message.content == text[: text.index(stop)]


def test_a_continued_conversation_reuses_the_cached_prefix(client):
    first = client.chat.completions.create(model="tiny", messages=LONG, max_tokens=8, temperature=0)
    history = [*LONG, {"role": "assistant", "content": first.choices[0].message.content},
               {"role": "user", "content": "and then?"}]
    second = client.chat.completions.create(model="tiny", messages=history, max_tokens=4, temperature=0)
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert first.usage.prompt_tokens <= cached < second.usage.prompt_tokens


WEATHER = {
    "type": "object",
    "properties": {
        "unit": {"enum": ["celsius", "fahrenheit"]},
        "rain": {"type": "boolean"},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
    },
    "required": ["unit", "rain", "days"],
    "additionalProperties": False,
}


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_json_schema_output_parses_and_validates(client, seed):
    reply = client.chat.completions.create(
        model="tiny", messages=LONG, max_tokens=200, temperature=1.0, seed=seed,
        response_format={"type": "json_schema", "json_schema": {"name": "weather", "schema": WEATHER}})
    assert reply.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(reply.choices[0].message.content), WEATHER)


def test_json_object_output_is_an_object(client):
    reply = client.chat.completions.create(model="tiny", messages=LONG, max_tokens=300, temperature=0,
                                           response_format={"type": "json_object"})
    if reply.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(reply.choices[0].message.content), dict)
    else:  # the budget ran out inside the object: what was written is still a valid start of one
        assert reply.choices[0].message.content.startswith("{")


TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                      "parameters": WEATHER}},
    {"type": "function", "function": {"name": "noop", "parameters": {
        "type": "object", "properties": {}, "additionalProperties": False}}},
]


def test_named_tool_choice_gives_a_valid_call(client):
    reply = client.chat.completions.create(model="tiny", messages=LONG, max_tokens=200, temperature=0.8, seed=4,
                                           tools=TOOLS,
                                           tool_choice={"type": "function", "function": {"name": "get_weather"}})
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    [call] = choice.message.tool_calls
    assert call.function.name == "get_weather" and call.id and call.type == "function"
    jsonschema.validate(json.loads(call.function.arguments), WEATHER)


def test_required_tool_choice_streams_a_call(client):
    chunks = list(client.chat.completions.create(model="tiny", messages=LONG, max_tokens=200, temperature=0.8,
                                                 seed=5, tools=TOOLS, tool_choice="required", stream=True))
    calls = [call for c in chunks for call in (c.choices[0].delta.tool_calls or [])]
    assert len(calls) == 1 and calls[0].function.name in ("get_weather", "noop")
    assert [c.choices[0].finish_reason for c in chunks if c.choices[0].finish_reason] == ["tool_calls"]


@pytest.mark.parametrize("choice", [None, "auto", "none"])
def test_tools_the_model_may_leave_unused(client, choice):
    extra = {} if choice is None else {"tool_choice": choice}
    reply = client.chat.completions.create(model="tiny", messages=LONG, max_tokens=6, temperature=0, tools=TOOLS,
                                           **extra)
    # The tiny model writes noise, not a call: the text comes back as content.
    assert reply.choices[0].finish_reason == "length" and reply.choices[0].message.content
    assert not reply.choices[0].message.tool_calls


def test_text_completion_streams_and_answers(client):
    whole = client.completions.create(model="tiny", prompt="hello", max_tokens=10, temperature=0)
    assert whole.choices[0].finish_reason == "length" and whole.usage.completion_tokens == 10
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model="tiny", prompt="hello", max_tokens=10, temperature=0, stream=True) if c.choices)
    assert streamed == whole.choices[0].text


def test_models_lists_the_served_model(client):
    assert [m.id for m in client.models.list()] == ["tiny"]


def test_errors_the_client_raises(client):
    with pytest.raises(openai.BadRequestError) as exc:
        client.chat.completions.create(model="tiny", messages=LONG, max_tokens=1020)
    assert exc.value.code == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError) as exc:
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x" * 1100}])
    assert exc.value.code == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="tiny", messages=LONG, temperature=5)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="tiny", messages=LONG, tools=TOOLS,
                                       tool_choice={"type": "function", "function": {"name": "missing"}})
    with pytest.raises(openai.NotFoundError):
        client.get("/nowhere", cast_to=object)


def test_wrong_key_and_full_queue(tiny_model_path):
    with running_server(tiny_model_path, api_key="right", max_waiting=0, max_batch=1) as server:
        wrong = openai.OpenAI(base_url=server.url, api_key="wrong", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            wrong.models.list()
        right = openai.OpenAI(base_url=server.url, api_key="right", max_retries=0)
        assert [m.id for m in right.models.list()] == ["tiny"]
        scheduler, release = server.state.served.scheduler, threading.Event()

        def hold(cancel):  # holds the model's only place until released, however fast the model is
            release.wait(30)
            yield from ()

        holder = scheduler.submit(Ticket(hold, lambda item: None, SERVER))
        try:
            while holder.started is None:
                release.wait(0.005)
            with pytest.raises(openai.RateLimitError) as exc:  # no place to run, no room to wait
                right.chat.completions.create(model="tiny", messages=LONG, max_tokens=4)
        finally:
            release.set()
        assert exc.value.response.headers["retry-after"]
        deadline = time.monotonic() + 30
        while scheduler.in_flight and time.monotonic() < deadline:  # the held place is given back
            release.wait(0.005)
        assert right.chat.completions.create(model="tiny", messages=LONG, max_tokens=4).usage.completion_tokens
