"""Streaming generation: prefill in chunks, then decode token by token, as events.

`generate` is a generator. Each decoded token yields a `GenerationEvent` with the new
text (possibly empty while a UTF-8 character or a possible stop string is incomplete),
the token id and the running metrics. The last event carries the finish reason.
"""

import threading
import time
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

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
        piece = list(tokens[lo : lo + chunk])
        logits = model.forward(np.asarray(piece, dtype=np.int64), cache.n_used, cache.storage)
        cache.tokens.extend(piece)
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
) -> Iterator[GenerationEvent]:
    """Continue `prompt` token by token, reusing whatever prefix the cache already holds.

    Stops on the model's end-of-generation tokens and `stop_ids` (unless
    `ignore_stop_tokens`, as for benchmarks), a stop string, `max_tokens`, a full context, or `cancel` being set
    (checked between decode steps). `sampler` replaces the one built from `params` (a
    sampler that masks tokens, for constrained output).
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
    steps = DecodeSteps(model, cache, sampler)
    detok = IncrementalDetokenizer(tokenizer)
    stops = StopStringFilter(stop_strings)
    stopping = frozenset(tokenizer.stop_ids) | frozenset(stop_ids)
    history = list(prompt)
    generated = 0
    pending = None  # what the next token is read from (see DecodeSteps); None: the prefill's logits
    finish: str | None
    while True:
        if cancel is not None and cancel.is_set():
            yield GenerationEvent(stops.flush() + detok.flush(), None, FINISH_CANCELLED, metrics)
            return
        step_started = time.perf_counter()
        ahead = None
        if steps.on_device and pending is not None and generated + 1 < max_tokens and cache.n_free > 0:
            ahead = steps.queue(pending)  # from a token still on the device, before it is read back
        token = sampler.sample(logits, history) if pending is None else steps.read(pending, history)
        history.append(token)
        generated += 1
        if token in stopping and not ignore_stop_tokens:
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
            pending = ahead if ahead is not None else steps.queue(token)
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


class DecodeSteps:
    """The one-token forward passes of a `generate` call, each queued as early as its input allows.

    Where the backend queues work without waiting for it (MLX), the host's share of a step
    then overlaps the device's:
    - plain greedy decoding (temperature 0, no penalties) on a backend with an `argmax`
      hook keeps every token on the device, and step n + 1 is queued from token n before
      token n is read back, as in mlx-lm's generate_step: the device does not wait for the
      host between steps;
    - other sampling reads the logits back and samples on the host; step n + 1 is queued
      as soon as token n is known to continue the text, and runs while its text is decoded
      and handed out. The device waits while the host samples.
    Where the backend computes as it is called (NumPy), each step runs when it is queued,
    and only once the text is known to continue.
    """

    def __init__(self, model: Transformer, cache: KVCache, sampler: Sampler):
        self.backend = model.backend
        self.cache = cache
        self.sampler = sampler
        self.step = model.decode_step(cache.storage)
        argmax = getattr(model.backend, "argmax", None)
        self.argmax = argmax if _argmax_only(sampler.params) and not sampler.masks_tokens else None

    @property
    def on_device(self) -> bool:
        """Whether tokens stay on the device (greedy decoding on a backend with `argmax`)."""
        return self.argmax is not None

    def queue(self, token: Any) -> Any:
        """Queue the step that feeds `token` (a host int, or a device token) at the cache's next
        position; return what the token after it will be read from (`read`)."""
        logits = self.step(token, self.cache.n_used)
        return self.argmax(logits) if self.argmax is not None else logits

    def read(self, pending: Any, history: list[int]) -> int:
        """The token `pending` stands for: read back from the device, or sampled on the host."""
        values = self.backend.to_host(pending)
        if self.argmax is not None:
            return int(values[0])
        return self.sampler.sample(values[-1], history)


def _argmax_only(params: SamplingParams) -> bool:
    """Whether sampling with `params` is a plain argmax: greedy, with every penalty neutral."""
    return params.temperature <= 0.0 and params.penalties_neutral
