"""Streaming from real OpenAI-compatible servers on loopback, and every way one can fail."""

import threading
import time

import httpx2
import pytest

from engine.errors import RemoteError
from engine.generation import FINISH_CANCELLED
from engine.model_uri import parse_model_uri
from engine.remote.client import RemoteChat, Timeouts, list_models
from engine.remote.endpoints import Endpoint, normalize_base_url
from engine.sampling import SamplingParams
from tests.engine.remote.conftest import free_port
from tests.engine.remote.faulty_server import FaultyServer, self_signed_context

QUESTION = [{"role": "user", "content": "Tell me a long story about a cat."}]
GREEDY = SamplingParams.greedy()


def answer(endpoint: Endpoint, model: str, max_tokens: int = 8):
    """(events, text) of a whole answer."""
    chat = RemoteChat(endpoint, model)
    try:
        events = list(chat.stream(QUESTION, GREEDY, max_tokens, threading.Event()))
    finally:
        chat.close()
    return events, "".join(e.text for e in events)


def in_flight(base_url: str) -> float:
    metrics = httpx2.get(base_url.removesuffix("/v1") + "/metrics").text
    return float(next(line.split()[-1] for line in metrics.splitlines() if line.startswith("sprig_requests_in_flight")))


# the two real servers


def test_sprig_server_streams_an_answer_with_its_figures(sprig_server):
    endpoint = Endpoint("Sprig here", sprig_server)
    assert list_models(endpoint, None) == ["smollm2"]
    events, text = answer(endpoint, "smollm2")
    assert text.strip() and len(events) > 2
    last = events[-1]
    assert last.finish_reason == "length"
    assert last.metrics.decode_tokens == 8  # from the stream's usage
    assert last.metrics.prefill_tokens > 5 and last.metrics.time_to_first_token > 0
    assert last.metrics.decode_tokens_per_second > 0


def test_stop_closes_the_stream_and_the_server_ends_the_request(sprig_server):
    chat = RemoteChat(Endpoint("Sprig here", sprig_server), "smollm2")
    cancel = threading.Event()
    events = []
    for event in chat.stream(QUESTION, GREEDY, 400, cancel):
        events.append(event)
        if len(events) == 3:
            assert in_flight(sprig_server) == 1
            cancel.set()
    chat.close()
    assert events[-1].finish_reason == FINISH_CANCELLED
    assert len(events) < 50  # it stopped, not finished
    deadline = time.monotonic() + 10
    while in_flight(sprig_server) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert in_flight(sprig_server) == 0


def test_llama_cpp_server_streams_an_answer(llama_server):
    endpoint = Endpoint("llama.cpp", llama_server)
    [model] = list_models(endpoint, None)
    events, text = answer(endpoint, model, max_tokens=6)
    assert text and events[-1].finish_reason in ("length", "stop")
    assert 0 < events[-1].metrics.decode_tokens <= 6


def test_a_remote_uri_names_the_server_and_the_model(sprig_server):
    description = RemoteChat(Endpoint("S", sprig_server), "org/model v2").describe()
    ref = parse_model_uri(description.uri)
    assert (ref.base_url, ref.model_id, description.where) == (sprig_server, "org/model v2", "S")


# reasoning


def test_reasoning_content_arrives_as_a_think_block(faulty):
    events, text = answer(Endpoint("R", faulty.url("reasoning")), "m")
    assert text == "<think>Let me think.</think>\n\nThe answer is 4."
    assert events[-1].finish_reason == "stop"
    assert events[-1].metrics.decode_tokens == 4 and events[-1].metrics.prefill_tokens == 5


def test_think_inside_content_is_passed_on_as_it_is(faulty):
    assert answer(Endpoint("T", faulty.url("think")), "m")[1] == "<think>hmm</think>Four."


# failures: each one line that names the server and says what to do


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("401", "Faulty refused the API key (HTTP 401). Check the key in Settings → Models. The server said: Invalid"),
        ("404", "Faulty has no model “m” (HTTP 404)"),
        ("429", "Faulty is rate-limiting requests (HTTP 429): try again in 7 s."),
        ("500", "Faulty failed with a server error (HTTP 500). Try again later. The server said: CUDA out of memory"),
    ],
)
def test_refusals_say_what_the_server_said(faulty, mode, expected):
    with pytest.raises(RemoteError) as caught:
        answer(Endpoint("Faulty", faulty.url(mode)), "m")
    assert str(caught.value).startswith(expected)
    assert caught.value.retry_after == (7.0 if mode == "429" else None)


def test_a_stream_cut_in_the_middle_keeps_what_came(faulty):
    chat = RemoteChat(Endpoint("Faulty", faulty.url("cut")), "m")
    received = []
    with pytest.raises(RemoteError, match="Faulty closed the connection in the middle of the answer"):
        for event in chat.stream(QUESTION, GREEDY, 8, threading.Event()):
            received.append(event.text)
    assert "".join(received) == "Half an answer"


def test_a_server_that_stops_answering_times_out(faulty):
    chat = RemoteChat(Endpoint("Faulty", faulty.url("hang")), "m", timeouts=Timeouts(read=1.0))
    received = []
    started = time.monotonic()
    with pytest.raises(RemoteError, match="Faulty stopped answering"):
        for event in chat.stream(QUESTION, GREEDY, 8, threading.Event()):
            received.append(event.text)
    assert received == ["Waiting"] and time.monotonic() - started < 10


def test_stop_while_the_server_is_silent_ends_at_once(faulty):
    chat = RemoteChat(Endpoint("Faulty", faulty.url("hang")), "m")
    cancel = threading.Event()
    events = []
    started = time.monotonic()
    for event in chat.stream(QUESTION, GREEDY, 8, cancel):
        events.append(event)
        cancel.set()
    assert [e.text for e in events] == ["Waiting", ""] and events[-1].finish_reason == FINISH_CANCELLED
    assert time.monotonic() - started < 5


def test_a_refused_connection_says_nothing_is_listening():
    with pytest.raises(RemoteError, match="refused the connection: nothing is listening there"):
        list_models(Endpoint("Nobody", f"http://127.0.0.1:{free_port()}/v1"), None)


def test_a_wrong_path_says_there_is_no_api_there(faulty):
    with pytest.raises(RemoteError, match="Faulty has no OpenAI API at this address"):
        list_models(Endpoint("Faulty", faulty.url("404")), None)


@pytest.mark.parametrize("url", ["localhost:8080", "ftp://host/v1", "http://host/v1?x=1"])
def test_an_address_that_is_no_server_url_is_refused_in_words(url):
    with pytest.raises(RemoteError, match="http"):
        normalize_base_url(url)


def test_tls_is_verified_unless_the_user_accepts_a_self_signed_certificate(tmp_path):
    server = FaultyServer(tls=self_signed_context(tmp_path))
    try:
        with pytest.raises(RemoteError, match=r"certificate could not be verified.*self-signed"):
            list_models(Endpoint("Mine", server.url("think")), None)
        assert list_models(Endpoint("Mine", server.url("think"), verify_tls=False), None) == ["m"]
    finally:
        server.close()
