"""Turning generated tokens into text one token at a time, for streaming.

A token can end in the middle of a UTF-8 character: an emoji may arrive as four byte
tokens, or as two byte-level BPE pieces. The detokenizer holds such bytes back until the
character is complete, so every piece of text it hands out is whole.
"""

import codecs

from engine.tokenizer import Tokenizer


class IncrementalDetokenizer:
    """Feeds token ids in, gets the newly completed text out.

    With `skip_special` (the default) control tokens such as `<|im_end|>` add no text.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special: bool = True):
        self._tokenizer = tokenizer
        self._special = not skip_special
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token_id: int) -> str:
        """Add one token; return the text it completes ('' while a character is unfinished)."""
        return self._utf8.decode(self._tokenizer.token_bytes(token_id, special=self._special))

    def flush(self) -> str:
        """End the stream: bytes of an unfinished character come out as U+FFFD."""
        return self._utf8.decode(b"", final=True)
