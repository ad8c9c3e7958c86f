"""Parsing tool calls out of answers, in the Hermes/Qwen and Llama 3 forms, on hand-written text."""

import json

from engine.server.tool_calls import HERMES, LLAMA3, parse_tool_calls


def test_hermes_calls_are_parsed_with_the_text_before_them():
    text = ('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
            '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>')
    content, calls = parse_tool_calls(text, HERMES)
    assert content == "Let me check."
    assert [c.name for c in calls] == ["get_weather", "get_time"]
    assert json.loads(calls[0].arguments) == {"city": "Paris"} and json.loads(calls[1].arguments) == {}
    assert calls[0].id != calls[1].id and calls[0].as_openai()["type"] == "function"


def test_hermes_call_cut_off_at_the_end_still_parses_when_its_json_is_whole():
    content, calls = parse_tool_calls('<tool_call>\n{"name": "f", "arguments": {"x": 1}}', HERMES)
    assert content is None and calls[0].name == "f" and json.loads(calls[0].arguments) == {"x": 1}


def test_broken_or_absent_calls_leave_the_text_alone():
    for text in ("Just an answer.", '<tool_call>\n{"name": "f", "argu', '<tool_call>["not", "a call"]</tool_call>'):
        assert parse_tool_calls(text, HERMES) == (text, [])


def test_llama3_json_call_with_parameters():
    content, calls = parse_tool_calls('<|python_tag|>{"name": "search", "parameters": {"q": "rivers"}}', LLAMA3)
    assert content is None and calls[0].name == "search" and json.loads(calls[0].arguments) == {"q": "rivers"}
    assert parse_tool_calls("The Nile is long.", LLAMA3) == ("The Nile is long.", [])
    assert parse_tool_calls('{"no": "name"}', LLAMA3) == ('{"no": "name"}', [])
