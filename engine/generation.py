"""Streaming generation, the text side: prefill in chunks, then turn tokens into events.

`generate` is a generator. It takes its tokens from a source in `engine.decoding` (plain
decoding, or speculative decoding), and each token yields a `GenerationEvent` with the new
text (possibly empty while a UTF-8 character or a possible stop string is incomplete),
the token id and the running metrics. The last event carries the finish reason.
"""

import threading
import time
from collections.abc import Collection, Iterator, Sequence
from contextlib import closing
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import numpy as np

from engine.decoding import DraftStats, plain_tokens
from engine.detokenizer import IncrementalDetokenizer
from engine.harmony import HarmonyDetokenizer, is_harmony
from engine.kv_cache import KVCache
from engine.models.common import Transformer
from engine.sampling import Sampler, SamplingParams
from engine.tokenizer import Tokenizer

if TYPE_CHECKING:
    from engine.speculation import Speculation

PREFILL_CHUNK = 256

FINISH_STOP_TOKEN = "stop"  # the model said it was done (EOS/EOT)
FINISH_STOP_STRING = "stop_string"  # a stop string appeared in the text
FINISH_LENGTH = "length"  # max_tokens reached
FINISH_CONTEXT_FULL = "context_full"  # no room left in the KV cache
FINISH_CANCELLED = "cancelled"  # the caller asked to stop


@dataclass(frozen=True)
class Metrics:
    """Speed and context figures of one answer so far."""

    prefill_tokens: int = 0
    prefill_seconds: float = 0.0
    time_to_first_token: float | None = None
    decode_tokens: int = 0
    decode_seconds: float = 0.0
    last_token_latency: float | None = None
    context_used: int = 0
    context_size: int = 0
    draft_rounds: int = 0  # verification passes that carried drafts (speculative decoding)
    drafted_tokens: int = 0
    accepted_tokens: int = 0

    @property
    def prefill_tokens_per_second(self) -> float | None:
        """Prompt tokens processed per second, once prefill has run."""
        return self.prefill_tokens / self.prefill_seconds if self.prefill_seconds > 0 else None

    @property
    def decode_tokens_per_second(self) -> float | None:
        """Generated tokens per second over the decode steps so far."""
        return self.decode_tokens / self.decode_seconds if self.decode_seconds > 0 else None

    @property
    def acceptance_rate(self) -> float | None:
        """The share of drafted tokens the model accepted, once something was drafted."""
        return self.accepted_tokens / self.drafted_tokens if self.drafted_tokens else None

    @property
    def mean_accepted_length(self) -> float | None:
        """Drafted tokens accepted per verification pass, once one ran."""
        return self.accepted_tokens / self.draft_rounds if self.draft_rounds else None

    def as_dict(self) -> dict:
        """Plain figures for JSON output and storage."""
        return {
            "prefill_tokens": self.prefill_tokens,
            "prefill_tok_s": self.prefill_tokens_per_second,
            "time_to_first_token_s": self.time_to_first_token,
            "decode_tokens": self.decode_tokens,
            "decode_tok_s": self.decode_tokens_per_second,
            "last_token_latency_s": self.last_token_latency,
            "context_used": self.context_used,
            "context_size": self.context_size,
            "drafted_tokens": self.drafted_tokens,
            "accepted_tokens": self.accepted_tokens,
            "acceptance_rate": self.acceptance_rate,
            "mean_accepted_length": self.mean_accepted_length,
        }


@dataclass(frozen=True)
class GenerationEvent:
    """One step of a streamed answer. `notice` carries messages such as dropped turns;
    `state_refused` says why the conversation's saved state was not used (its text was read
    again instead)."""

    text: str = ""
    token: int | None = None
    finish_reason: str | None = None
    metrics: Metrics = field(default_factory=Metrics)
    notice: str | None = None
    state_refused: str | None = None


class StopStringFilter:
    """Holds back text that could be the start of a stop string, and spots complete ones."""

    def __init__(self, stop_strings: Sequence[str]):
        self.stop_strings = [s for s in stop_strings if s]
        self.pending = ""

    def feed(self, text: str) -> tuple[str, bool]:
        """Add text; return (text safe to show, whether a stop string was completed)."""
        self.pending += text
        hits = [self.pending.find(s) for s in self.stop_strings if s in self.pending]
        if hits:
            safe, self.pending = self.pending[: min(hits)], ""
            return safe, True
        hold = max((_overlap(self.pending, s) for s in self.stop_strings), default=0)
        safe = self.pending[: len(self.pending) - hold]
        self.pending = self.pending[len(safe) :]
        return safe, False

    def flush(self) -> str:
        """The held-back text, when generation ends without a stop string."""
        text, self.pending = self.pending, ""
        return text


def _overlap(text: str, stop: str) -> int:
    """Length of the longest end of `text` that is a proper start of `stop`."""
    for n in range(min(len(text), len(stop) - 1), 0, -1):
        if text.endswith(stop[:n]):
            return n
    return 0


def prefill(model: Transformer, cache: KVCache, tokens: Sequence[int], chunk: int = PREFILL_CHUNK) -> np.ndarray:
    """Append `tokens` to the cache in chunks; return the logits after the last one, (vocab,)."""
    cache.check_room(len(tokens))
    if not tokens:
        raise ValueError("prefill needs at least one token")
    logits = None
    for lo in range(0, len(tokens), chunk):
        logits = cache.feed(model, tokens[lo : lo + chunk])
    assert logits is not None  # the loop ran at least once
    return logits[-1]


def generate(
    model: Transformer,
    tokenizer: Tokenizer,
    cache: KVCache,
    prompt: Sequence[int],
    params: SamplingParams = SamplingParams(),
    *,
    max_tokens: int = 256,
    stop_strings: Sequence[str] = (),
    stop_ids: Collection[int] = (),
    cancel: threading.Event | None = None,
    ignore_stop_tokens: bool = False,
    sampler: Sampler | None = None,
    speculation: "Speculation | None" = None,
) -> Iterator[GenerationEvent]:
    """Continue `prompt`, reusing whatever prefix the cache already holds (mlx-lm's stream_generate).

    Tokens come from plain decoding, or from speculative decoding when `speculation` says
    so (`engine.speculation`); this side turns them into text and events either way.
    Stops on the model's end-of-generation tokens and `stop_ids` (unless
    `ignore_stop_tokens`, as for benchmarks), a stop string, `max_tokens`, a full context, or
    `cancel` being set (checked between tokens). An answer ends at the same token, with the
    same cache, whichever source produced it. `sampler` replaces the one built from `params`
    (a sampler that masks tokens, for constrained output; it decodes plainly).
    """
    reused = cache.common_prefix(list(prompt))
    if reused == len(prompt):  # logits of the last prompt token are needed again
        reused -= 1
    cache.truncate(reused)
    new_tokens = list(prompt[reused:])
    metrics = Metrics(context_size=cache.n_ctx)

    started = time.perf_counter()
    logits = prefill(model, cache, new_tokens)
    prefill_seconds = time.perf_counter() - started
    metrics = replace(
        metrics, prefill_tokens=len(new_tokens), prefill_seconds=prefill_seconds, context_used=cache.n_used
    )

    sampler = sampler or Sampler(params)
    stats = DraftStats()
    if speculation is None or not speculation.enabled or sampler.masks_tokens:
        source = plain_tokens(model, cache, logits, sampler, prompt, max_tokens)
    else:
        source = speculation.tokens(model, cache, logits, sampler, prompt, max_tokens, stats)
    detok = HarmonyDetokenizer(tokenizer) if is_harmony(tokenizer) else IncrementalDetokenizer(tokenizer)
    stops = StopStringFilter(stop_strings)
    stopping = frozenset(tokenizer.stop_ids) | frozenset(stop_ids)
    generated = 0
    with closing(source):
        while True:
            if cancel is not None and cancel.is_set():
                yield GenerationEvent(stops.flush() + detok.flush(), None, FINISH_CANCELLED, metrics)
                return
            step_started = time.perf_counter()
            token = next(source)
            generated += 1
            finish: str | None
            if token in stopping and not ignore_stop_tokens:
                text, finish = stops.flush() + detok.flush(), FINISH_STOP_TOKEN
            else:
                text, stopped = stops.feed(detok.push(token))
                finish = FINISH_STOP_STRING if stopped else None
                if finish is None and generated >= max_tokens:
                    finish = FINISH_LENGTH
                elif finish is None and len(prompt) + generated - 1 >= cache.n_ctx:
                    finish = FINISH_CONTEXT_FULL  # no room to feed this token
                if finish in (FINISH_LENGTH, FINISH_CONTEXT_FULL):
                    text += stops.flush() + detok.flush()
            elapsed = time.perf_counter() - step_started
            metrics = replace(
                metrics,
                time_to_first_token=metrics.time_to_first_token or (time.perf_counter() - started),
                decode_tokens=generated,
                decode_seconds=metrics.decode_seconds + elapsed,
                last_token_latency=elapsed,
                context_used=min(len(prompt) + generated, cache.n_ctx),
                draft_rounds=stats.rounds,
                drafted_tokens=stats.drafted,
                accepted_tokens=stats.accepted,
            )
            yield GenerationEvent(text, token, finish, metrics)
            if finish is not None:
                return
