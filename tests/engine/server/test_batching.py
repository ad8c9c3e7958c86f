"""Generations decoded together: the scheduler's batched steps against each generation alone.

The reference for every answer is `generate` run directly, on a fresh cache, with no
scheduler: one sequence, one decode step per token. Under the scheduler the same answers
are decoded in lock-step, their plain steps joined into one `decode_batch` pass (a spy on
the model records each pass's size, to show that batching really happened), and must come
out token for token the same: greedy ones, and sampled ones with a seed (sampling stays
per request, on the host). Around that: a generation that joins a running batch, one that
is cancelled inside a batch, the app's chat in the same batch as server requests, the
OpenAI client against a batching server, and nothing left behind over rounds.
"""

import contextlib
import subprocess
import sys
import threading

import numpy as np
import openai
import pytest

from engine.chat_session import ChatSession
from engine.generation import FINISH_CANCELLED, generate
from engine.loader import load_model
from engine.sampling import SamplingParams
from engine.server.scheduler import APP, END, SERVER, QueueFull, Scheduler, Ticket
from tests.engine.server.conftest import running_server
from tests.engine.server.test_cancellation_and_load import wait_until

N_TOKENS = 24
GREEDY = SamplingParams.greedy()
SAMPLED = SamplingParams(temperature=0.9, top_k=0, top_p=1.0, min_p=0.0, seed=7)


@pytest.fixture(scope="module", params=["numpy", "cpu"])
def loaded(request, tiny_model_path):
    model = load_model(tiny_model_path, request.param)
    yield model
    model.close()


@pytest.fixture
def batch_sizes(loaded, monkeypatch):
    """The size of every batched pass the model runs (a spy: it records and passes on).

    Every batch of two or more runs as one pass here, the cpu backend's too (which batches
    only from four in use: see `test_a_backend_batches_from_its_least_worthwhile_size`).
    """
    monkeypatch.setattr(loaded.backend, "min_decode_batch", 2)
    sizes: list[int] = []
    real = loaded.model.decode_batch

    def spy(token_ids, positions, kv_storages):
        sizes.append(len(token_ids))
        return real(token_ids, positions, kv_storages)

    monkeypatch.setattr(loaded.model, "decode_batch", spy)
    return sizes


@pytest.fixture
def scheduler():
    with contextlib.closing(Scheduler(max_batch=4)) as s:
        yield s


def prompts(loaded, n: int) -> list[list[int]]:
    rng = np.random.default_rng(2)
    return [rng.integers(0, loaded.config.vocab_size, size=4 + 3 * i).tolist() for i in range(n)]


def alone(loaded, prompt, params=GREEDY, n=N_TOKENS) -> list[int]:
    """The reference: the answer's tokens from `generate` on its own, no scheduler."""
    events = generate(loaded.model, loaded.tokenizer, loaded.new_cache(128), prompt, params, max_tokens=n,
                      ignore_stop_tokens=True)
    return [e.token for e in events if e.token is not None]


class Answer:
    """A generation as a server ticket: its tokens and finish reason, collected as they come."""

    def __init__(self, loaded, prompt, params=GREEDY, n=N_TOKENS, on_token=None):
        self.tokens: list[int] = []
        self.finish: str | None = None
        self.error: BaseException | None = None
        self.done = threading.Event()
        self.on_token = on_token
        cache = loaded.new_cache(128)

        def run(cancel):
            return generate(loaded.model, loaded.tokenizer, cache, prompt, params, max_tokens=n, cancel=cancel,
                            ignore_stop_tokens=True)

        self.ticket = Ticket(run, self.deliver, SERVER)

    def deliver(self, item):
        if item is END or isinstance(item, BaseException):
            self.error = None if item is END else item
            self.done.set()
            return
        if item.token is not None:
            self.tokens.append(item.token)
            if self.on_token is not None:
                self.on_token(len(self.tokens))
        self.finish = item.finish_reason or self.finish


@contextlib.contextmanager
def held(scheduler):
    """Hold the engine (a ticket waiting in its turn) while the block submits, then let go:
    whatever was submitted starts together."""
    release, started = threading.Event(), threading.Event()

    def hold(cancel):
        started.set()
        release.wait(10)
        yield from ()

    scheduler.submit(Ticket(hold, lambda item: None, APP))
    assert started.wait(5)
    try:
        yield
    finally:
        release.set()


def finished(answers) -> bool:
    return all(a.done.wait(30) for a in answers) and all(a.error is None for a in answers)


def test_answers_decoded_together_equal_each_one_alone(loaded, scheduler, batch_sizes):
    batch_prompts = prompts(loaded, 4)
    params = [GREEDY, GREEDY, SAMPLED, GREEDY]
    answers = [Answer(loaded, p, q) for p, q in zip(batch_prompts, params, strict=True)]
    with held(scheduler):
        for answer in answers:
            scheduler.submit(answer.ticket)
    assert finished(answers)
    assert batch_sizes.count(4) == N_TOKENS - 1  # every step after the first token, all four together
    for answer, prompt, q in zip(answers, batch_prompts, params, strict=True):
        assert answer.tokens == alone(loaded, prompt, q)


def test_a_generation_joins_a_running_batch_at_the_next_step(loaded, scheduler, batch_sizes):
    first, second, late = prompts(loaded, 3)
    joined = Answer(loaded, late)

    def join_at(count):
        if count == 5:
            scheduler.submit(joined.ticket)

    answers = [Answer(loaded, first, on_token=join_at), Answer(loaded, second, n=2 * N_TOKENS)]
    with held(scheduler):
        for answer in answers:
            scheduler.submit(answer.ticket)
    assert finished([*answers, joined])
    assert batch_sizes[:4] == [2, 2, 2, 2] and 3 in batch_sizes  # two alone, then the late one with them
    assert joined.tokens == alone(loaded, late)
    assert answers[0].tokens == alone(loaded, first)
    assert answers[1].tokens == alone(loaded, second, n=2 * N_TOKENS)


def test_cancelling_one_generation_leaves_the_others_intact(loaded, scheduler, batch_sizes):
    batch_prompts = prompts(loaded, 3)
    answers = [Answer(loaded, p) for p in batch_prompts]
    answers[1].on_token = lambda count: count == 3 and answers[1].ticket.cancel.set()
    with held(scheduler):
        for answer in answers:
            scheduler.submit(answer.ticket)
    assert finished(answers)
    assert answers[1].finish == FINISH_CANCELLED and len(answers[1].tokens) == 3
    assert answers[1].tokens == alone(loaded, batch_prompts[1])[:3]
    assert answers[0].tokens == alone(loaded, batch_prompts[0])
    assert answers[2].tokens == alone(loaded, batch_prompts[2])
    assert batch_sizes[:3] == [3, 3, 2] and set(batch_sizes[3:]) == {2}  # it left the batch after its step


def test_the_apps_chat_decodes_in_the_same_batch_as_server_requests(loaded, scheduler, batch_sizes):
    def session():
        return ChatSession(loaded, params=GREEDY, max_tokens=N_TOKENS)

    reference = "".join(e.text for e in session().send("hello there"))
    server_prompts = prompts(loaded, 2)
    answers = [Answer(loaded, p) for p in server_prompts]
    app_text = []

    def chat():  # the app's worker: its own thread, reading the scheduler's stream
        chat_session = session()
        app_text.extend(e.text for e in scheduler.stream(lambda c: chat_session.send("hello there", c),
                                                         threading.Event(), APP))

    worker = threading.Thread(target=chat)
    with held(scheduler):
        for answer in answers:
            scheduler.submit(answer.ticket)
        worker.start()
        while scheduler.waiting < 3:
            threading.Event().wait(0.005)
    worker.join(30)
    assert finished(answers)
    assert "".join(app_text) == reference
    assert 3 in batch_sizes
    for answer, prompt in zip(answers, server_prompts, strict=True):
        assert answer.tokens == alone(loaded, prompt)


def test_rounds_of_batches_leave_nothing_behind(loaded, scheduler, batch_sizes):
    baseline = threading.active_count()
    for _ in range(3):
        answers = [Answer(loaded, p) for p in prompts(loaded, 6)]  # four run, two wait their turn
        for answer in answers:
            scheduler.submit(answer.ticket)
        assert finished(answers)
        assert wait_until(lambda: scheduler.in_flight == 0 and scheduler.waiting == 0)
        assert threading.active_count() <= baseline  # every generation's thread has ended
    assert max(batch_sizes) == 4 and scheduler.stats.served == 18


def test_openai_clients_decoded_together_get_their_answers_alone(tiny_model_path):
    with running_server(tiny_model_path, max_batch=4) as server:
        served = server.state.served
        spy_sizes: list[int] = []
        real = served.loaded.model.decode_batch
        served.loaded.model.decode_batch = lambda *a: spy_sizes.append(len(a[0])) or real(*a)
        client = openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=30)
        texts = [f"story {i}:" for i in range(4)]

        def complete(text):
            reply = client.completions.create(model="tiny", prompt=text, max_tokens=N_TOKENS, temperature=0)
            return reply.choices[0].text, reply.usage.completion_tokens

        expected = [complete(text) for text in texts]  # one at a time: nothing to batch with
        assert spy_sizes == []  # a sequence alone takes its own steps
        results: dict[int, tuple] = {}
        with held(served.scheduler):
            threads = [threading.Thread(target=lambda i=i: results.update({i: complete(texts[i])})) for i in range(4)]
            for thread in threads:
                thread.start()
            while served.scheduler.waiting < 4:
                threading.Event().wait(0.005)
        for thread in threads:
            thread.join(30)
        assert [results[i] for i in range(4)] == expected
        assert 4 in spy_sizes
        assert len(served.caches.caches) == 4  # a cache each while they ran together


def test_the_queue_holds_max_waiting_beyond_the_free_places_of_the_batch():
    with contextlib.closing(Scheduler(max_waiting=1, max_batch=2)) as scheduler, held(scheduler):
        for _ in range(3):  # two to fill the batch, one to wait
            scheduler.submit(Ticket(lambda cancel: iter(()), lambda item: None, SERVER))
        with pytest.raises(QueueFull):
            scheduler.submit(Ticket(lambda cancel: iter(()), lambda item: None, SERVER))
        scheduler.submit(Ticket(lambda cancel: iter(()), lambda item: None, APP))  # the app is never refused


def test_the_apps_chat_starts_while_the_batch_is_full():
    with contextlib.closing(Scheduler(max_batch=1)) as scheduler:
        release, log = threading.Event(), []

        def server_request(cancel):  # 5 s unless the app's chat runs beside it
            for step in range(500):
                if release.wait(0.01):
                    return
                log.append("server")
                yield step

        def app_chat(cancel):
            log.append("app")
            release.set()
            yield "answer"

        scheduler.submit(Ticket(server_request, lambda item: None, SERVER))
        while "server" not in log:
            release.wait(0.005)
        assert list(scheduler.stream(app_chat, threading.Event(), APP)) == ["answer"]
        assert log.count("server") < 500  # the chat ran beside the request, not after it


def test_a_batch_below_one_is_refused_in_one_line(tiny_model_path):
    with pytest.raises(ValueError, match="max_batch"):
        Scheduler(max_batch=0)
    result = subprocess.run([sys.executable, "-m", "engine", "serve", "--model", str(tiny_model_path),
                             "--max-batch", "0"], check=False, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "--max-batch" in result.stderr


def test_a_backend_that_cannot_batch_steps_each_generation_in_turn(loaded, scheduler, batch_sizes, monkeypatch):
    monkeypatch.setattr(loaded.backend, "batched_decode", False)  # as MLX, whose RoPE wants consecutive positions
    batch_prompts = prompts(loaded, 3)
    answers = [Answer(loaded, p) for p in batch_prompts]
    with held(scheduler):
        for answer in answers:
            scheduler.submit(answer.ticket)
    assert finished(answers)
    assert batch_sizes == []
    for answer, prompt in zip(answers, batch_prompts, strict=True):
        assert answer.tokens == alone(loaded, prompt)


def test_a_failed_pass_ends_the_generations_in_it_and_the_next_ones_run(loaded, scheduler, monkeypatch):
    def out_of_memory(*args):
        raise MemoryError("no room for the batch")

    monkeypatch.setattr(loaded.backend, "min_decode_batch", 2)

    real = loaded.model.decode_batch
    monkeypatch.setattr(loaded.model, "decode_batch", out_of_memory)
    failing = [Answer(loaded, p) for p in prompts(loaded, 2)]
    with held(scheduler):
        for answer in failing:
            scheduler.submit(answer.ticket)
    assert all(a.done.wait(30) for a in failing)
    assert all(isinstance(a.error, MemoryError) and len(a.tokens) == 1 for a in failing)
    monkeypatch.setattr(loaded.model, "decode_batch", real)
    later = Answer(loaded, prompts(loaded, 1)[0])
    scheduler.submit(later.ticket)
    assert finished([later]) and later.tokens == alone(loaded, prompts(loaded, 1)[0])


def test_a_backend_batches_from_its_least_worthwhile_size(loaded, scheduler, batch_sizes, monkeypatch):
    monkeypatch.setattr(loaded.backend, "min_decode_batch", 3)
    batch_prompts = prompts(loaded, 3)
    answers = [Answer(loaded, p, n=n) for p, n in zip(batch_prompts, (8, 16, 16), strict=True)]
    with held(scheduler):
        for answer in answers:
            scheduler.submit(answer.ticket)
    assert finished(answers)
    assert batch_sizes == [3] * 7  # once the shortest answer ends, the other two take their own steps
    for answer, prompt in zip(answers, batch_prompts, strict=True):
        assert answer.tokens == alone(loaded, prompt, n=len(answer.tokens))
