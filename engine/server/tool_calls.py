"""Tool calls in a model's output, in the two common forms, and the schemas that force one.

- Hermes / Qwen (Qwen2.5, Qwen3, the Bonsai models): each call is a JSON object
  `{"name": ..., "arguments": {...}}` between `<tool_call>` and `</tool_call>` tags.
- Llama 3.1+: the whole answer is one JSON object `{"name": ..., "parameters": {...}}`,
  optionally after `<|python_tag|>`.

The form follows the vocabulary: a model with a `<|python_tag|>` token writes Llama 3's,
any other the Hermes form.
"""

import json
import re
import uuid
from dataclasses import dataclass

from engine.tokenizer import Tokenizer

HERMES = "hermes"
LLAMA3 = "llama3"

_HERMES_OPEN = "<tool_call>"
_HERMES_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)


@dataclass(frozen=True)
class ToolCall:
    """One parsed call: the function's name and its arguments as JSON text."""

    name: str
    arguments: str
    id: str

    def as_openai(self) -> dict:
        """The call as an OpenAI `tool_calls` entry."""
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


def call_style(tokenizer: Tokenizer) -> str:
    """Which form this model writes its calls in (see the module docstring)."""
    return LLAMA3 if "<|python_tag|>" in tokenizer.special_tokens else HERMES


def _call_from(obj: object, arguments_key: str) -> ToolCall | None:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    arguments = obj.get(arguments_key, obj.get("arguments", {}))
    text = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    return ToolCall(obj["name"], text, f"call_{uuid.uuid4().hex[:24]}")


def parse_tool_calls(text: str, style: str) -> tuple[str | None, list[ToolCall]]:
    """Split an answer into its plain content (None when empty) and the calls it makes.

    Text that looks like a call but does not parse stays in the content, untouched.
    """
    if style == LLAMA3:
        body = text.strip().removeprefix("<|python_tag|>").strip()
        try:
            call = _call_from(json.loads(body), "parameters") if body.startswith("{") else None
        except json.JSONDecodeError:
            call = None
        return (None, [call]) if call else (text or None, [])
    if _HERMES_OPEN not in text:
        return text or None, []
    calls = []
    for block in _HERMES_BLOCK.findall(text):
        try:
            call = _call_from(json.loads(block), "arguments")
        except json.JSONDecodeError:
            call = None
        if call is None:
            return text, []
        calls.append(call)
    content = text[: text.index(_HERMES_OPEN)].strip()
    return content or None, calls


def call_schema(name: str, parameters: dict | None, style: str) -> dict:
    """The JSON schema of one call object to function `name` with `parameters` (a JSON schema)."""
    arguments_key = "parameters" if style == LLAMA3 else "arguments"
    return {
        "type": "object",
        "properties": {"name": {"const": name}, arguments_key: parameters or {"type": "object"}},
        "required": ["name", arguments_key],
        "additionalProperties": False,
    }
