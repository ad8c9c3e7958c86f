"""n, logprobs / top_logprobs and logit_bias through the official `openai` client.

The references are computed here, from the model's own forward pass (`model.forward` on a
fresh state) and a log-softmax in NumPy, not from the server's code.
"""

import numpy as np
import openai
import pytest

from engine.loader import load_model

MESSAGES = [{"role": "user", "content": "hello"}]
CHATML = "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def client(tiny_server):
    return openai.OpenAI(base_url=tiny_server.url, api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def reference(tiny_model_path):
    loaded = load_model(tiny_model_path, "numpy")
    yield loaded
    loaded.close()


def all_logits(loaded, tokens):
    """The model's logits (T, vocab) after each of `tokens`, from a fresh state."""
    cache = loaded.new_cache(256)
    return loaded.model.forward(tokens, 0, cache.storage, all_logits=True)


def log_softmax(x):
    x = x.astype(np.float64)
    return x - x.max() - np.log(np.exp(x - x.max()).sum())


def greedy_reference(loaded, bias, steps):
    """Greedy tokens after the chat prompt under `bias`, and each step's log-probabilities."""
    tokens = loaded.tokenizer.encode(CHATML, parse_special=True)
    answer, logprobs = [], []
    for _ in range(steps):
        logits = all_logits(loaded, tokens + answer)[-1].copy()
        for token, value in bias.items():
            logits[token] += value
        lp = log_softmax(logits)
        answer.append(int(np.argmax(lp)))
        logprobs.append(lp)
    return answer, logprobs


def test_n_choices_differ_and_each_is_its_seed(client):
    many = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=12, temperature=1.0,
                                          top_p=1.0, extra_body={"top_k": 0, "min_p": 0.0}, seed=7, n=3)
    texts = [c.message.content for c in sorted(many.choices, key=lambda c: c.index)]
    assert [c.index for c in many.choices] == [0, 1, 2]
    assert len(set(texts)) == 3
    for i, text in enumerate(texts):
        alone = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=12, temperature=1.0,
                                               top_p=1.0, extra_body={"top_k": 0, "min_p": 0.0}, seed=7 + i)
        assert alone.choices[0].message.content == text
    assert many.usage.completion_tokens == 36


def test_n_choices_stream_each_under_its_index(client):
    whole = client.completions.create(model="tiny", prompt="hello there", max_tokens=10, temperature=1.0,
                                      seed=3, n=2)
    chunks = list(client.completions.create(model="tiny", prompt="hello there", max_tokens=10, temperature=1.0,
                                            seed=3, n=2, stream=True))
    streamed = {0: "", 1: ""}
    for chunk in chunks:
        for choice in chunk.choices:
            streamed[choice.index] += choice.text
    assert streamed == {c.index: c.text for c in whole.choices}


def test_logprobs_are_the_log_softmax_of_the_models_logits(client, reference):
    bias = {5: 3.5, 17: -2.0}
    tokens, logprobs = greedy_reference(reference, bias, 8)
    reply = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=8, temperature=0,
                                           logprobs=True, top_logprobs=5,
                                           logit_bias={str(k): v for k, v in bias.items()})
    content = reply.choices[0].logprobs.content
    assert len(content) == 8
    tokenizer = reference.tokenizer
    for entry, token, lp in zip(content, tokens, logprobs, strict=True):
        assert bytes(entry.bytes) == tokenizer.token_bytes(token, special=True)
        assert entry.logprob == pytest.approx(lp[token], abs=1e-4)
        top = np.argsort(-lp, kind="stable")[:5]
        assert [bytes(t.bytes) for t in entry.top_logprobs] == [tokenizer.token_bytes(int(i), special=True) for i in top]
        assert [t.logprob for t in entry.top_logprobs] == pytest.approx(lp[top].tolist(), abs=1e-4)


def test_completion_logprobs_shape(client, reference):
    reply = client.completions.create(model="tiny", prompt="hello there", max_tokens=6, temperature=0, logprobs=2)
    lp = reply.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 6
    assert "".join(lp.tokens) == reply.choices[0].text
    assert all(len(top) <= 2 for top in lp.top_logprobs)
    prompt = reference.tokenizer.encode("hello there", parse_special=True)
    first = log_softmax(all_logits(reference, prompt)[-1])
    assert lp.token_logprobs[0] == pytest.approx(first.max(), abs=1e-4)


def test_streamed_logprobs_equal_the_whole_answers(client):
    kwargs = dict(model="tiny", messages=MESSAGES, max_tokens=10, temperature=0, logprobs=True, top_logprobs=2)
    whole = client.chat.completions.create(**kwargs).choices[0].logprobs.content
    chunks = list(client.chat.completions.create(**kwargs, stream=True))
    streamed = [e for c in chunks if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert [(e.token, e.logprob) for e in streamed] == [(e.token, e.logprob) for e in whole]


def test_a_banned_token_never_appears(client, reference):
    tokenizer = reference.tokenizer
    prompt = tokenizer.encode(CHATML, parse_special=True)
    likely = np.argsort(-all_logits(reference, prompt)[-1], kind="stable")
    counts: dict[bytes, int] = {}
    for i in range(reference.config.vocab_size):
        piece = tokenizer.token_bytes(i, special=True)
        counts[piece] = counts.get(piece, 0) + 1
    banned = [int(i) for i in likely if counts[tokenizer.token_bytes(int(i), special=True)] == 1][:20]
    banned_bytes = {tokenizer.token_bytes(i, special=True) for i in banned}
    bias = {str(i): -100 for i in banned}
    reply = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=30, temperature=1.5,
                                           top_p=1.0, extra_body={"top_k": 0, "min_p": 0.0}, seed=1, n=4, logprobs=True,
                                           logit_bias=bias)
    seen = [bytes(e.bytes) for c in reply.choices for e in c.logprobs.content]
    assert len(seen) > 30 and not banned_bytes & set(seen)
    # Without the ban the same request does sample them.
    free = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=30, temperature=1.5,
                                          top_p=1.0, extra_body={"top_k": 0, "min_p": 0.0}, seed=1, n=4, logprobs=True)
    assert banned_bytes & {bytes(e.bytes) for c in free.choices for e in c.logprobs.content}


@pytest.mark.parametrize("kwargs", [
    {"n": 9}, {"logit_bias": {"3": 150}}, {"logit_bias": {"-3": 1}}, {"logit_bias": {"100000": 1}},
    {"top_logprobs": 2}, {"logprobs": True, "top_logprobs": 25},
])
def test_values_out_of_bounds_get_400(client, kwargs):
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=2, **kwargs)
