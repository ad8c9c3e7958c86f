"""Constrained sampling: only tokens that can continue valid output may be drawn.

The grammars and the token masks come from llguidance (Microsoft's Rust engine behind
Guidance, a small self-contained wheel): a JSON schema, or a Lark grammar that embeds
one, is compiled against the model's vocabulary, and before every draw its matcher says
which tokens may come next. The mask sets the others' logits to -inf; the sampler then
works as usual, and the drawn token advances the matcher. When the grammar is complete,
only the end-of-turn tokens remain allowed, so the answer ends there.

Why llguidance: it builds its token trie from the vocabulary's raw bytes (which our
`Tokenizer` already gives), needs neither torch nor transformers, and computes a mask in
well under a millisecond. xgrammar wants torch for its masks; outlines-core builds an
index per schema up front, seconds for large vocabularies.
"""

import json
from collections.abc import Sequence
from functools import lru_cache

import llguidance
import numpy as np
from llguidance.numpy import (
    allocate_token_bitmask,
    apply_token_bitmask_inplace,
    fill_next_token_bitmask,
)

from engine.errors import SprigError
from engine.sampling import Sampler, SamplingParams
from engine.tokenizer import Tokenizer


class GrammarError(SprigError):
    """A schema or grammar that cannot be compiled, or output that left it."""


class _VocabularyView:
    """What llguidance's TokenizerWrapper reads: every token's bytes, the specials and EOS."""

    def __init__(self, tokenizer: Tokenizer, stop_ids: list[int]):
        self._tokenizer = tokenizer
        self.tokens = [tokenizer.token_bytes(i, special=True) for i in range(tokenizer.vocab_size)]
        self.special_token_ids = [i for i in range(tokenizer.vocab_size) if tokenizer.is_special(i)]
        self.eos_token_id = stop_ids[0]
        self.bos_token_id = tokenizer.bos_id

    def __call__(self, text: str | bytes) -> list[int]:
        if isinstance(text, bytes):
            text = text.decode("utf-8", errors="replace")
        return self._tokenizer.encode(text, add_bos=False)


@lru_cache(maxsize=4)
def guidance_tokenizer(tokenizer: Tokenizer, stop_ids: tuple[int, ...]) -> llguidance.LLTokenizer:
    """llguidance's view of `tokenizer`, ending output with any of `stop_ids` (built once, ~1 s)."""
    view = _VocabularyView(tokenizer, list(stop_ids))
    return llguidance.LLTokenizer(
        llguidance.TokenizerWrapper(view), n_vocab=tokenizer.vocab_size, eos_token=list(stop_ids)
    )


def json_schema_grammar(schema: dict) -> str:
    """The grammar of JSON text that matches `schema` (compact separators, no free whitespace)."""
    try:
        return llguidance.LLMatcher.grammar_from_json_schema(schema, defaults={"whitespace_flexible": False})
    except ValueError as exc:
        raise GrammarError(f"the JSON schema cannot be used: {exc}") from exc


def lark_grammar(source: str) -> str:
    """A grammar from Lark source (which may embed JSON schemas with `%json {...}`)."""
    return llguidance.LLMatcher.grammar_from_lark(source)


def tool_call_grammar(schemas: list[dict], style: str) -> str:
    """Output that is exactly one call to one of the functions whose call objects `schemas` describe.

    `style` "hermes" wraps the call in <tool_call> tags (Qwen, Hermes); "llama3" writes the
    bare JSON object.
    """
    schema = dict(schemas[0]) if len(schemas) == 1 else {"anyOf": schemas}
    schema["x-guidance"] = {"whitespace_flexible": False}
    call = f"%json {json.dumps(schema)}"
    if style == "hermes":
        return lark_grammar(f'start: "<tool_call>\\n" call "\\n</tool_call>"\ncall: {call}\n')
    return lark_grammar(f"start: call\ncall: {call}\n")


class GuidedSampler(Sampler):
    """A sampler whose draws stay inside a grammar."""

    masks_tokens = True

    def __init__(self, params: SamplingParams, grammar: str, tokenizer: Tokenizer, stop_ids: tuple[int, ...]):
        super().__init__(params)
        lltok = guidance_tokenizer(tokenizer, stop_ids)
        self.matcher = llguidance.LLMatcher(lltok, grammar, log_level=0)
        if self.matcher.is_error():
            raise GrammarError(f"the output format cannot be used: {self.matcher.get_error()}")
        self.bitmask = allocate_token_bitmask(1, tokenizer.vocab_size)  # (1, ceil(vocab / 32)) int32

    def sample(self, logits: np.ndarray, history: Sequence[int] = ()) -> int:
        """Draw from the tokens the grammar allows next, and advance the grammar."""
        logits = np.array(logits, dtype=np.float32)  # a copy: the mask writes into it, (vocab,)
        fill_next_token_bitmask(self.matcher, self.bitmask)
        apply_token_bitmask_inplace(logits, self.bitmask)
        token = super().sample(logits, history)
        self.matcher.consume_token(token)
        if self.matcher.is_error():
            raise GrammarError(f"constrained output went wrong: {self.matcher.get_error()}")
        return token


def check_grammar(grammar: str, tokenizer: Tokenizer, stop_ids: tuple[int, ...]) -> None:
    """Raise GrammarError when `grammar` does not compile for this vocabulary."""
    error = llguidance.LLMatcher.validate_grammar(grammar, guidance_tokenizer(tokenizer, stop_ids))
    if error and not error.startswith("WARNING"):
        raise GrammarError(f"the output format cannot be used: {error}")
