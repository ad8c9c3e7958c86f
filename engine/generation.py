"""Streaming generation: prefill in chunks, then decode token by token, as events.

`generate` is a generator. Each decoded token yields a `GenerationEvent` with the new
text (possibly empty while a UTF-8 character or a possible stop string is incomplete),
the token id and the running metrics. The last event carries the finish reason.
"""

import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from engine.detokenizer import IncrementalDetokenizer
from engine.kv_cache import KVCache
from engine.models.common import Transformer
from engine.sampling import Sampler, SamplingParams
from engine.tokenizer import Tokenizer

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

    @property
    def prefill_tokens_per_second(self) -> float | None:
        """Prompt tokens processed per second, once prefill has run."""
        return self.prefill_tokens / self.prefill_seconds if self.prefill_seconds > 0 else None

    @property
    def decode_tokens_per_second(self) -> float | None:
        """Generated tokens per second over the decode steps so far."""
        return self.decode_tokens / self.decode_seconds if self.decode_seconds > 0 else None

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
        }


@dataclass(frozen=True)
class GenerationEvent:
    """One step of a streamed answer. `notice` carries messages such as dropped turns."""

    text: str = ""
    token: int | None = None
    finish_reason: str | None = None
    metrics: Metrics = field(default_factory=Metrics)
    notice: str | None = None


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
        self.pending = self.pending[len(safe):]
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
    logits = None
    for lo in range(0, len(tokens), chunk):
        piece = list(tokens[lo:lo + chunk])
        logits = model.forward(np.asarray(piece, dtype=np.int64), cache.n_used, cache.storage)
        cache.tokens.extend(piece)
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
    cancel: threading.Event | None = None,
) -> Iterator[GenerationEvent]:
    """Continue `prompt` token by token, reusing whatever prefix the cache already holds.

    Stops on the model's end-of-generation tokens, a stop string, `max_tokens`, a full
    context, or `cancel` being set (checked between decode steps).
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
    metrics = replace(metrics, prefill_tokens=len(new_tokens), prefill_seconds=prefill_seconds,
                      context_used=cache.n_used)

    sampler = Sampler(params)
    detok = IncrementalDetokenizer(tokenizer)
    stops = StopStringFilter(stop_strings)
    history = list(prompt)
    generated = 0
    while True:
        if cancel is not None and cancel.is_set():
            yield GenerationEvent(stops.flush() + detok.flush(), None, FINISH_CANCELLED, metrics)
            return
        step_started = time.perf_counter()
        token = sampler.sample(logits, history)
        history.append(token)
        generated += 1
        if token in tokenizer.stop_ids:
            text, finish = stops.flush() + detok.flush(), FINISH_STOP_TOKEN
        else:
            text, stopped = stops.feed(detok.push(token))
            finish = FINISH_STOP_STRING if stopped else None
            if finish is None and generated >= max_tokens:
                finish = FINISH_LENGTH
            elif finish is None and cache.n_free == 0:
                finish = FINISH_CONTEXT_FULL
            if finish in (FINISH_LENGTH, FINISH_CONTEXT_FULL):
                text += stops.flush() + detok.flush()
        if finish is None:
            logits = model.forward(np.asarray([token], dtype=np.int64), cache.n_used, cache.storage)[-1]
            cache.tokens.append(token)
        elapsed = time.perf_counter() - step_started
        metrics = replace(
            metrics,
            time_to_first_token=metrics.time_to_first_token or (time.perf_counter() - started),
            decode_tokens=generated,
            decode_seconds=metrics.decode_seconds + elapsed,
            last_token_latency=elapsed,
            context_used=cache.n_used,
        )
        yield GenerationEvent(text, token, finish, metrics)
        if finish is not None:
            return
