"""gpt-oss's harmony answers: reasoning, answer and tool calls read from the channel markers,
and the turn ending only where harmony ends it."""

import json

import pytest

from engine.gguf_file import open_gguf
from engine.harmony import HarmonyDetokenizer, is_harmony
from engine.server.tool_calls import HERMES, parse_tool_calls
from engine.tokenizer import Tokenizer
from tests.gguf_factory import write_tiny_model


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    path = write_tiny_model(tmp_path_factory.mktemp("harmony") / "oss.gguf", arch="gpt-oss", n_layers=1)
    with open_gguf(path) as f:
        return Tokenizer.from_metadata(f.metadata, str(path))


def ids(tokenizer, *parts):
    """Token ids of `parts`: a marker's own id, or the text's tokens."""
    out = []
    for part in parts:
        out += [tokenizer.special_tokens[part]] if part in tokenizer.special_tokens else tokenizer.encode(part)
    return out


def read(tokenizer, tokens):
    detok = HarmonyDetokenizer(tokenizer)
    return "".join(detok.push(t) for t in tokens) + detok.flush()


def test_the_vocabulary_is_recognised(tokenizer):
    assert is_harmony(tokenizer)


def test_a_message_ends_and_the_turn_goes_on(tokenizer):
    specials = tokenizer.special_tokens
    assert specials["<|end|>"] not in tokenizer.stop_ids  # as llama.cpp: <|end|> ends one message
    assert {specials["<|return|>"], specials["<|call|>"]} <= tokenizer.stop_ids


def test_analysis_is_reasoning_and_final_the_answer(tokenizer):
    tokens = ids(tokenizer, "<|channel|>", "analysis", "<|message|>", "the user greets", "<|end|>",
                 "<|start|>", "assistant", "<|channel|>", "final", "<|message|>", "Hello there")
    assert read(tokenizer, tokens) == "<think>the user greets</think>Hello there"


def test_two_thoughts_make_one_reasoning_block(tokenizer):
    tokens = ids(tokenizer, "<|channel|>", "analysis", "<|message|>", "one", "<|end|>",
                 "<|start|>", "assistant", "<|channel|>", "analysis", "<|message|>", "two", "<|end|>",
                 "<|start|>", "assistant", "<|channel|>", "final", "<|message|>", "done")
    assert read(tokenizer, tokens) == "<think>one\ntwo</think>done"


def test_an_answer_cut_while_thinking_closes_its_block(tokenizer):
    assert read(tokenizer, ids(tokenizer, "<|channel|>", "analysis", "<|message|>", "hmm")) == "<think>hmm</think>"


def test_a_call_to_a_function_becomes_a_tool_call(tokenizer):
    tokens = ids(tokenizer, "<|channel|>", "analysis", "<|message|>", "need weather", "<|end|>",
                 "<|start|>", "assistant", "<|channel|>", "commentary to=functions.get_weather ", "<|constrain|>",
                 "json", "<|message|>", '{"city": "Paris"}')  # the <|call|> token stops generation
    text = read(tokenizer, tokens)
    content, calls = parse_tool_calls(text, HERMES)
    assert content == "<think>need weather</think>"
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather", {"city": "Paris"})]
