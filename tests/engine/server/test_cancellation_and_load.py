"""Clients that leave, and many clients at once: generation stops, queues drain, nothing leaks."""

import contextlib
import threading
import time

import httpx2 as httpx
import openai
import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.engine.server.conftest import running_server

LONG = [{"role": "user", "content": "hello"}]  # the tiny model answers this greedily without ever stopping


def metrics(server) -> dict[str, float]:
    """Every sample of /metrics, by name and labels, read with Prometheus' own parser."""
    text = httpx.get(server.url.removesuffix("/v1") + "/metrics").text
    return {name + "".join(f"[{v}]" for v in labels.values()): value
            for family in text_string_to_metric_families(text)
            for name, labels, value, *_ in family.samples}


def wait_until(condition, timeout=10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.01)
    return False


@pytest.fixture
def server(tiny_model_path):
    with running_server(tiny_model_path, max_waiting=8) as server:
        yield server


def client_of(server):
    return openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=30)


def test_closing_a_stream_after_two_chunks_stops_generation(server):
    scheduler = server.state.served.scheduler
    with client_of(server).chat.completions.create(model="tiny", messages=LONG, max_tokens=900, temperature=0,
                                                   stream=True) as stream:
        chunks = iter(stream)
        next(chunks), next(chunks)
    assert wait_until(lambda: scheduler.in_flight == 0 and metrics(server).get("sprig_requests_total[chat][cancelled]"))
    figures = metrics(server)
    assert figures["sprig_generated_tokens_total"] < 300  # of the 900 it would have written
    assert figures["sprig_requests_in_flight"] == 0


def test_a_waiting_request_whose_client_left_never_starts(server):
    scheduler = server.state.served.scheduler
    client = client_of(server)
    with contextlib.ExitStack() as holders:
        for _ in range(scheduler.max_batch):  # these fill the batch
            holder = holders.enter_context(client.chat.completions.create(
                model="tiny", messages=LONG, max_tokens=900, temperature=0, stream=True))
            next(iter(holder))
        with client.chat.completions.create(model="tiny", messages=LONG, max_tokens=4, stream=True):
            assert wait_until(lambda: scheduler.waiting == 1)
        assert wait_until(lambda: scheduler.waiting == 0)  # left before its turn
    assert wait_until(lambda: scheduler.in_flight == 0)
    assert scheduler.stats.skipped == 1 and scheduler.stats.served == scheduler.max_batch


def test_a_client_that_times_out_cancels_a_whole_answer(server):
    scheduler = server.state.served.scheduler
    with pytest.raises(httpx.TimeoutException):
        httpx.post(server.url + "/chat/completions", json={"messages": LONG, "max_tokens": 900, "temperature": 0},
                   timeout=0.3)
    assert wait_until(lambda: scheduler.in_flight == 0 and metrics(server).get("sprig_requests_total[chat][cancelled]"))
    assert metrics(server)["sprig_generated_tokens_total"] < 900


@pytest.mark.timeout(120)
def test_twenty_streaming_clients_three_rounds(server):
    served = server.state.served
    outcomes: list[str] = []
    lock = threading.Lock()

    def one_client(index: int) -> None:
        try:
            stream = client_of(server).chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": f"client {index}"}], max_tokens=16, stream=True)
            finish = [c.choices[0].finish_reason for c in stream if c.choices and c.choices[0].finish_reason]
            outcome = f"finished:{finish[0]}" if len(finish) == 1 else f"odd:{finish}"
        except openai.RateLimitError as exc:
            outcome = "429" if exc.response.headers.get("retry-after") else "429 without Retry-After"
        except Exception as exc:  # noqa: BLE001 - anything else is recorded, and fails the test below
            outcome = f"error:{type(exc).__name__}:{exc}"
        with lock:
            outcomes.append(outcome)

    process = psutil.Process()
    baseline_threads = None
    rss = []
    for _ in range(3):
        clients = [threading.Thread(target=one_client, args=(i,)) for i in range(20)]
        for thread in clients:
            thread.start()
        for thread in clients:
            thread.join(60)
        assert wait_until(lambda: served.scheduler.in_flight == 0 and served.scheduler.waiting == 0)
        threads = threading.active_count()
        baseline_threads = baseline_threads or threads
        assert threads <= baseline_threads  # no thread left behind by a round
        rss.append(process.memory_info().rss)

    assert len(outcomes) == 60
    assert all(o in ("finished:stop", "finished:length", "429") for o in outcomes), set(outcomes)
    served_count = sum(o.startswith("finished") for o in outcomes)
    assert served_count >= 3 * (4 + 8)  # at least the four decoding together and the eight waiting, each round
    assert rss[2] - rss[0] < 50 * 2**20  # rounds two and three did not keep what they used
    figures = metrics(server)
    assert figures["sprig_requests_total[chat][completed]"] == served_count
    assert figures["sprig_requests_total[chat][refused]"] == 60 - served_count
    assert figures["sprig_queue_wait_seconds_count"] == served_count
    assert figures["sprig_queue_length"] == 0 and figures["sprig_requests_in_flight"] == 0
    assert len(served.caches.caches) <= served.scheduler.max_batch  # one per request decoding at once, kept
    assert all(cache.n_used <= served.n_ctx for cache in served.caches.caches)
