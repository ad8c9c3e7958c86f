"""OpenAI's harmony format (gpt-oss): an answer as a run of messages on named channels,
turned into the text the rest of Sprig reads.

A gpt-oss answer looks like this, the markers being special tokens:

    <|channel|>analysis<|message|>The user wants...<|end|>
    <|start|>assistant<|channel|>final<|message|>Paris.<|return|>

or, calling a tool,

    <|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}<|call|>

`HarmonyDetokenizer` reads the tokens as they come and writes: the `analysis` channel as a
`<think>` block (the app shows it collapsed, as other models' reasoning); the `final`
channel (and commentary without a recipient) as the answer; a message to `functions.NAME`
as a Hermes `<tool_call>` block, which the server's tool-call parser reads. It has the
incremental detokenizer's two calls, `push` and `flush`.
"""

import json

from engine.detokenizer import IncrementalDetokenizer
from engine.tokenizer import Tokenizer

MARKERS = ("<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|return|>", "<|call|>", "<|constrain|>")


def is_harmony(tokenizer: Tokenizer) -> bool:
    """Whether the vocabulary writes harmony messages (it has every marker)."""
    return all(marker in tokenizer.special_tokens for marker in MARKERS)


class HarmonyDetokenizer:
    """Tokens of a harmony answer in, the reasoning, answer and tool calls out as text."""

    def __init__(self, tokenizer: Tokenizer):
        self._text = IncrementalDetokenizer(tokenizer)
        self._marker = {tokenizer.special_tokens[m]: m for m in MARKERS}
        self._header = ""  # the channel and recipient of the message being read, until <|message|>
        self._in_header = True  # an answer starts in the header of its first message
        self._open = ""  # what closes the block being written: "</think>", "\"}</tool_call>", or ""

    def push(self, token_id: int) -> str:
        """Add one token; return the text it completes."""
        marker = self._marker.get(token_id)
        if marker is None:
            text = self._text.push(token_id)
            if self._in_header:
                self._header += text
                return ""
            return text
        if marker == "<|start|>":  # a new message: its role, maybe a recipient, then its channel
            self._in_header, self._header = True, ""
            return ""
        if marker == "<|channel|>":  # the role's text goes; a recipient named with it stays
            self._in_header = True
            self._header = " ".join(w for w in self._header.split() if w.startswith("to="))
            return ""
        if marker == "<|constrain|>":
            return ""
        if marker == "<|message|>":
            self._in_header = False
            return self._begin(self._header)
        return self._end_message(final=marker != "<|end|>")  # <|end|>, <|return|>, <|call|>

    def flush(self) -> str:
        """End the stream, closing any block left open."""
        return self._text.flush() + self._close()

    def _begin(self, header: str) -> str:
        words = header.split()
        channel = next((w for w in words if not w.startswith("to=")), "final")
        recipient = next((w.removeprefix("to=") for w in words if w.startswith("to=")), None)
        if channel == "analysis":
            if self._open == "</think>":
                return "\n"  # one more thought of the same block
            opened, self._open = self._close() + "<think>", "</think>"
            return opened
        closed = self._close()
        if recipient and recipient.startswith("functions."):
            self._open = "}\n</tool_call>"
            name = json.dumps(recipient.removeprefix("functions."))
            return closed + f'<tool_call>\n{{"name": {name}, "arguments": '
        return closed

    def _end_message(self, final: bool) -> str:
        self._header, self._in_header = "", True
        if self._open == "</think>" and not final:
            return ""  # the reasoning may go on in the next message
        return self._close()

    def _close(self) -> str:
        closing, self._open = self._open, ""
        return closing
