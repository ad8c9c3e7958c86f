"""Streaming generation and chat sessions on the real bundled SmolLM2 model."""

import threading

import numpy as np
import pytest

from backends.kv_types import DEFAULT_KV_TYPE
from engine.bench import bench
from engine.bundled import bundled_model
from engine.chat_session import ChatSession, chat_prompt_tokens
from engine.errors import ContextFullError
from engine.generation import StopStringFilter, generate, prefill
from engine.loader import load_model
from engine.sampling import SamplingParams

GREEDY = SamplingParams.greedy()


@pytest.fixture(scope="module")
def smollm2():
    loaded = load_model(bundled_model("smollm2").path, "numpy")
    yield loaded
    loaded.close()


def chat_prompt(loaded, text):
    return chat_prompt_tokens(loaded, [{"role": "user", "content": text}])


def run(loaded, prompt, params=GREEDY, n_ctx=512, **kwargs):
    cache = loaded.new_cache(n_ctx)
    events = list(generate(loaded.model, loaded.tokenizer, cache, prompt, params, **kwargs))
    return events, cache


def test_stop_string_filter_holds_back_partial_matches():
    f = StopStringFilter(["</answer>"])
    assert f.feed("Paris</an") == ("Paris", False)
    assert f.feed("swer> tail") == ("", True)
    g = StopStringFilter(["###"])
    assert g.feed("a#") == ("a", False)
    assert g.feed("b") == ("#b", False)  # not a stop string after all: released
    assert g.flush() == ""


def test_greedy_answer_streams_and_stops_on_end_of_turn(smollm2):
    events, _ = run(smollm2, chat_prompt(smollm2, "What is the capital of France?"), max_tokens=40)
    text = "".join(e.text for e in events)
    assert "Paris" in text
    assert events[-1].finish_reason == "stop"
    assert events[-1].token in smollm2.tokenizer.stop_ids
    assert all(e.finish_reason is None for e in events[:-1])
    metrics = events[-1].metrics
    assert metrics.time_to_first_token > 0 and metrics.prefill_tokens_per_second > 0
    assert metrics.decode_tokens == len(events) and metrics.decode_tokens_per_second > 0


def test_max_tokens(smollm2):
    events, cache = run(smollm2, chat_prompt(smollm2, "Write a long story about a dragon."), max_tokens=5)
    assert len(events) == 5 and events[-1].finish_reason == "length"


def test_ignoring_stop_tokens_runs_on_to_max_tokens(smollm2):
    prompt = chat_prompt(smollm2, "What is the capital of France?")
    stopped, _ = run(smollm2, prompt, max_tokens=40)
    end = len(stopped) - 1  # where the answer ended on its end-of-turn token
    assert stopped[end].token in smollm2.tokenizer.stop_ids
    events, _ = run(smollm2, prompt, max_tokens=end + 3, ignore_stop_tokens=True)
    assert [e.token for e in events[:end + 1]] == [e.token for e in stopped]
    assert events[end].finish_reason is None and len(events) == end + 3
    assert events[-1].finish_reason == "length"


def test_bench_times_the_asked_steps_through_generate(smollm2, monkeypatch):
    steps = []
    decode_step = smollm2.model.decode_step

    def counted(kv_storage):
        step = decode_step(kv_storage)
        return lambda token, start: steps.append(start) or step(token, start)

    monkeypatch.setattr(smollm2.model, "decode_step", counted)
    result = bench(smollm2, prompt_tokens=24, gen_tokens=10)
    assert steps[-10:] == list(range(24, 34))  # the measured run: 10 steps after 24 prompt tokens
    assert len(steps) == 4 + 10  # after the warm-up's 4
    assert result["prompt_tokens"] == 24 and result["gen_tokens"] == 10
    assert result["prefill_tok_s"] > 0 and result["decode_tok_s"] > 0
    assert result["decode_tok_s"] == pytest.approx(10 / result["decode_s"])


def test_stop_string_ends_generation_and_is_not_shown(smollm2):
    events, _ = run(smollm2, chat_prompt(smollm2, "What is the capital of France?"), max_tokens=40,
                    stop_strings=["Paris"])
    assert events[-1].finish_reason == "stop_string"
    assert "Paris" not in "".join(e.text for e in events)


def test_context_full_finish_reason(smollm2):
    prompt = chat_prompt(smollm2, "Write a long story about a dragon.")
    events, cache = run(smollm2, prompt, n_ctx=len(prompt) + 3, max_tokens=50)
    assert events[-1].finish_reason == "context_full"
    assert cache.n_used == cache.n_ctx


def test_cancel_from_another_thread_stops_within_one_step(smollm2):
    cancel = threading.Event()
    cache = smollm2.new_cache(512)
    seen = []
    for event in generate(smollm2.model, smollm2.tokenizer, cache, chat_prompt(smollm2, "Count to one hundred."),
                          GREEDY, max_tokens=100, cancel=cancel):
        seen.append(event)
        if len(seen) == 3:
            threading.Thread(target=cancel.set).start()
            threading.Event().wait(0.05)
    assert seen[-1].finish_reason == "cancelled"
    assert len(seen) == 4


def test_same_seed_same_text(smollm2):
    prompt = chat_prompt(smollm2, "Tell me a joke.")
    params = SamplingParams(temperature=1.0, seed=123)
    texts = ["".join(e.text for e in run(smollm2, prompt, params, max_tokens=12)[0]) for _ in range(2)]
    other = "".join(e.text for e in run(smollm2, prompt, SamplingParams(temperature=1.0, seed=321), max_tokens=12)[0])
    assert texts[0] == texts[1]
    assert other != texts[0]


def test_chunked_prefill_equals_one_shot(smollm2):
    prompt = chat_prompt(smollm2, "Summarise the plot of Hamlet in three sentences, please.")
    # float32 keys: NumPy's products round differently in chunks of 7, and a float16 cache
    # can turn those last-bit differences into whole float16 steps
    smollm2.model.set_kv_type("f32")
    try:
        one = smollm2.new_cache(256)
        whole = smollm2.model.forward(np.asarray(prompt), 0, one.storage)
        chunked = smollm2.new_cache(256)
        last = prefill(smollm2.model, chunked, prompt, chunk=7)
    finally:
        smollm2.model.set_kv_type(DEFAULT_KV_TYPE)
    np.testing.assert_allclose(last, whole[-1], rtol=1e-4, atol=1e-4)


# -- chat sessions -------------------------------------------------------------------


def test_second_turn_prefills_only_the_new_tokens(smollm2):
    session = ChatSession(smollm2, params=GREEDY, max_tokens=24)
    list(session.send("Hi! What is 2 + 2?"))
    held_before = list(session.cache.tokens)
    second_prompt = chat_prompt_tokens(smollm2, session.messages + [{"role": "user", "content": "And 3 + 3?"}])
    events = list(session.send("And 3 + 3?"))
    common = 0
    for a, b in zip(held_before, second_prompt):
        if a != b:
            break
        common += 1
    prefilled = events[-1].metrics.prefill_tokens
    assert prefilled == len(second_prompt) - common
    assert prefilled < len(second_prompt) // 2, "the history must come from the cache"
    assert session.messages[-1]["role"] == "assistant" and session.messages[-1]["content"]


def test_edit_rewinds_to_the_divergence(smollm2):
    session = ChatSession(smollm2, system_prompt="You are terse.", params=GREEDY, max_tokens=16)
    list(session.send("Name a colour."))
    list(session.send("Name a fruit."))
    events = list(session.edit(1, "Name an animal."))
    assert [m["role"] for m in session.messages] == ["system", "user", "assistant"]
    assert session.messages[1]["content"] == "Name an animal."
    fresh = ChatSession(smollm2, system_prompt="You are terse.", params=GREEDY, max_tokens=16)
    fresh_events = list(fresh.send("Name an animal."))
    assert "".join(e.text for e in events) == "".join(e.text for e in fresh_events)
    assert events[-1].metrics.prefill_tokens < fresh_events[-1].metrics.prefill_tokens


def test_regenerate_replaces_the_last_answer(smollm2):
    session = ChatSession(smollm2, params=SamplingParams(temperature=1.0, seed=1), max_tokens=12)
    list(session.send("Say something."))
    n = len(session.messages)
    list(session.regenerate())
    assert len(session.messages) == n and session.messages[-1]["role"] == "assistant"


def test_overflow_drops_oldest_turns_keeps_system_and_says_so(smollm2):
    session = ChatSession(smollm2, system_prompt="Be brief.", n_ctx=96, params=GREEDY, max_tokens=8)
    notices = []
    for question in ["Tell me about the sea and the waves.", "Tell me about mountains and rivers.",
                     "Tell me about forests and trees.", "What about deserts?"]:
        notices += [e.notice for e in session.send(question) if e.notice]
    assert notices and "oldest" in notices[0]
    assert session.messages[0] == {"role": "system", "content": "Be brief."}
    assert session.messages[1]["role"] == "user"
    assert "What about deserts?" in [m["content"] for m in session.messages]
    assert "Tell me about the sea and the waves." not in [m["content"] for m in session.messages]


def test_a_message_longer_than_the_context_is_a_clear_error(smollm2):
    session = ChatSession(smollm2, n_ctx=64, params=GREEDY, max_tokens=8)
    with pytest.raises(ContextFullError, match="too long for the context"):
        list(session.send("word " * 200))
