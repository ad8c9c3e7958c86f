"""Constrained sampling on the tiny model: whatever the random weights want, the output follows the grammar."""

import json

import jsonschema
import pytest

from engine.chat_session import answer_stops, chat_prompt_tokens
from engine.generation import FINISH_STOP_TOKEN, generate
from engine.loader import load_model
from engine.sampling import SamplingParams
from engine.server.constrained import (
    GrammarError,
    GuidedSampler,
    json_schema_grammar,
    tool_call_grammar,
)
from engine.server.tool_calls import LLAMA3, call_schema, parse_tool_calls

POINT = {"type": "object", "properties": {"x": {"type": "integer", "minimum": -5, "maximum": 5},
                                          "label": {"enum": ["a", "b"]}},
         "required": ["x", "label"], "additionalProperties": False}


@pytest.fixture(scope="module")
def tiny(tiny_model_path):
    loaded = load_model(tiny_model_path, "numpy")
    yield loaded
    loaded.close()


def constrained_text(loaded, grammar, seed):
    stops = answer_stops(loaded)
    stop_ids = tuple(sorted(set(loaded.tokenizer.stop_ids) | stops["stop_ids"]))
    params = SamplingParams(temperature=1.0, seed=seed)
    sampler = GuidedSampler(params, grammar, loaded.tokenizer, stop_ids)
    prompt = chat_prompt_tokens(loaded, [{"role": "user", "content": "hello"}])
    events = list(generate(loaded.model, loaded.tokenizer, loaded.new_cache(1024), prompt, params, max_tokens=200,
                           sampler=sampler, **stops))
    assert events[-1].finish_reason == FINISH_STOP_TOKEN  # the grammar ended it, not the budget
    return "".join(e.text for e in events)


@pytest.mark.parametrize("seed", [0, 1])
def test_llama3_style_call_is_bare_json_with_parameters(tiny, seed):
    text = constrained_text(tiny, tool_call_grammar([call_schema("plot", POINT, LLAMA3)], LLAMA3), seed)
    content, [call] = parse_tool_calls(text, LLAMA3)
    assert content is None and call.name == "plot"
    jsonschema.validate(json.loads(call.arguments), POINT)


def test_schema_output_without_the_server(tiny):
    jsonschema.validate(json.loads(constrained_text(tiny, json_schema_grammar(POINT), 3)), POINT)


def test_a_grammar_that_does_not_compile_is_refused(tiny):
    with pytest.raises(GrammarError):
        GuidedSampler(SamplingParams(), tool_call_grammar([{"type": "no-such-type"}], LLAMA3), tiny.tokenizer, (tiny.tokenizer.eos_id,))
