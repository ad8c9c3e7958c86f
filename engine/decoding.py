"""Sources of tokens: plain decoding, one token per forward pass, and speculative decoding.

These are mlx-lm's `generate_step` and `speculative_generate_step`: generators that hold
the KV cache and the sampler and yield token ids, nothing else. The text side
(`engine.generation.generate`) wraps either one with the detokenizer, stop strings,
metrics and finish reasons.

A source's contract with the text side:
- it starts from the logits after the prompt (the prefill's) and `history`, the prompt;
- when it yields a token, the cache holds every earlier token, and the yielded token is
  fed only if the caller asks for the next one; when the caller closes the source after a
  token, the cache holds exactly what plain decoding would hold there (a speculative
  source rolls back the drafts it verified past that point);
- it never yields more than `limit` tokens, nor feeds past the end of the context.
"""

import time
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from engine.batching import batched_step
from engine.kv_cache import KVCache
from engine.models.common import Transformer
from engine.sampling import Sampler, SamplingParams


@dataclass
class DraftStats:
    """What speculation did in one answer: verification passes that carried drafts, and how
    many draft tokens they checked and accepted."""

    rounds: int = 0
    drafted: int = 0
    accepted: int = 0


@dataclass(frozen=True)
class Draft:
    """A drafter's proposal: tokens, and the distributions they were drawn from.

    `probs` is None for a deterministic drafter (n-gram lookup, a greedy draft model),
    whose tokens the verifier checks by sample-and-match; otherwise (len(tokens), vocab),
    the drafter's final distribution q at each position, for the standard accept rule.
    """

    tokens: list[int]
    probs: np.ndarray | None = None


class Drafter(Protocol):
    """Proposes up to `k` tokens that continue `history` (the prompt and the answer so far)."""

    def propose(self, history: Sequence[int], k: int) -> Draft:
        """At most `k` tokens; fewer, or none, when the drafter has no good guess."""


class DraftLength(Protocol):
    """Chooses how many tokens to draft each round and learns from the outcome (see
    `engine.speculation.AdaptiveController`)."""

    def choose(self, most: int) -> int:
        """A draft length from 0 (a plain step) to `most`."""

    def record(self, drafted: int, accepted: int) -> None:
        """The outcome of a round that checked `drafted` tokens and accepted `accepted`."""

    def timed(self, n_tokens: int, seconds: float) -> None:
        """How long a round's pass took that fed `n_tokens` (1: a plain step), checking included; not
        the rollback after it (which a recurrent model's controller counts apart)."""


def plain_tokens(
    model: Transformer, cache: KVCache, logits: np.ndarray, sampler: Sampler, history: Sequence[int], limit: int
) -> Generator[int, None, None]:
    """Decode one token per forward pass (mlx-lm's generate_step).

    `logits` (vocab,) are those after the last token of `history`, which the cache holds.
    On a backend that keeps greedy tokens on its device (see `DecodeSteps`), the step of
    token n is queued before token n is read back.
    """
    steps = DecodeSteps(model, cache, sampler)
    history = list(history)
    pending = None  # what the next token is read from (see DecodeSteps); None: `logits`
    for produced in range(1, limit + 1):
        ahead = None
        if steps.on_device and pending is not None and produced < limit and cache.n_free > 0:
            ahead = steps.queue(pending, cache.n_used)  # a token still on the device, fed before it is read
        token = sampler.sample(logits, history) if pending is None else steps.read(pending, history)
        history.append(token)
        yield token
        if ahead is None:
            cache.check_room(1)
            ahead = steps.queue(token, cache.n_used)
        cache.append([token])
        pending = ahead


def speculative_tokens(
    model: Transformer,
    cache: KVCache,
    logits: np.ndarray,
    sampler: Sampler,
    history: Sequence[int],
    limit: int,
    drafter: Drafter,
    lengths: DraftLength,
    stats: DraftStats,
) -> Generator[int, None, None]:
    """Decode with drafts checked by the model (mlx-lm's speculative_generate_step).

    Each round the drafter proposes up to `lengths.choose(...)` tokens; one forward pass
    over the last token and the drafts gives the model's logits at every position, and
    `verify` keeps the longest agreeing run plus one token of the model's own. The cache
    then rolls back the rejected drafts. With no draft the round is a plain step.
    """
    history = list(history)
    token = sampler.sample(logits, history)
    history.append(token)
    produced = 1
    yield token
    while produced < limit:
        most = min(lengths.choose(limit - produced - 1), cache.n_ctx - len(history))
        draft = drafter.propose(history, most) if most > 0 else Draft([])
        fed = [history[-1], *draft.tokens]
        began = time.perf_counter()
        logits = cache.feed(model, fed, all_logits=True)  # (1 + drafts, vocab)
        kept = verify(sampler, logits, history, draft)
        lengths.timed(len(fed), time.perf_counter() - began)
        cache.trim(len(draft.tokens) - (len(kept) - 1))
        if draft.tokens:
            stats.rounds += 1
            stats.drafted += len(draft.tokens)
            stats.accepted += len(kept) - 1
            lengths.record(len(draft.tokens), len(kept) - 1)
        for i, token in enumerate(kept):
            history.append(token)
            produced += 1
            try:
                yield token
            except GeneratorExit:
                cache.trim(len(kept) - 1 - i)  # the accepted drafts after this token
                raise


def verify(sampler: Sampler, logits: np.ndarray, history: list[int], draft: Draft) -> list[int]:
    """The tokens the model keeps from one round: the accepted drafts, then one of its own.

    `logits` (len(draft.tokens) + 1, vocab) are the model's after `history` and after each
    draft. Position i samples with the penalties of `history` plus the drafts before i.
    - Deterministic drafts (`draft.probs` None): sample the model at each position with the
      normal sampler and accept while its token equals the draft (sample-and-match). The
      draw that disagrees is the correction; after a full run, the next draw is the bonus.
      Every kept token costs one draw, as in plain decoding, so a seeded run gives the
      same tokens as plain decoding.
    - Sampled drafts: accept draft x with probability min(1, p(x) / q(x)); on rejection draw
      from max(0, p - q), normalized; after a full run draw a bonus token from p. p and q
      are the final distributions (penalties, top-k, top-p, min-p, temperature).
    """
    tokens = draft.tokens
    kept: list[int] = []
    for i in range(len(tokens) + 1):
        context = history + tokens[:i]
        if draft.probs is None:
            token = sampler.sample(logits[i], context)
            kept.append(token)
            if i == len(tokens) or token != tokens[i]:
                return kept
            continue
        p = sampler.distribution(logits[i], context)
        if i == len(tokens):
            kept.append(_draw(sampler, p))
            return kept
        proposed, q = tokens[i], draft.probs[i]
        if sampler.rng.random() * q[proposed] < p[proposed]:
            kept.append(proposed)
            continue
        residual = np.maximum(p - q, 0.0)
        kept.append(_draw(sampler, residual / residual.sum()))
        return kept
    return kept


def _draw(sampler: Sampler, probs: np.ndarray) -> int:
    """A token from a distribution over the whole vocabulary, with the sampler's generator."""
    return int(sampler.rng.choice(probs.size, p=probs))


class DecodeSteps:
    """The one-token forward passes of plain decoding, each queued as early as its input allows.

    Where the backend queues work without waiting for it (MLX), the host's share of a step
    then overlaps the device's:
    - plain greedy decoding (temperature 0, no penalties) on a backend with
      `device_tokens` keeps every token on the device, and step n + 1 is queued from token n before
      token n is read back, as in mlx-lm's generate_step: the device does not wait for the
      host between steps;
    - sampling without penalties or masks on a backend with `device_sampling` (CUDA) draws
      each token on the device too, with the host sampler's rules and its generator's draw, and
      goes on the same way;
    - other sampling reads the logits back and samples on the host; step n + 1 is queued
      once the text side asks for the token after n.
    Where the backend computes as it is called (NumPy, cpu), each step runs when it is queued.
    Inside a batch (`engine.batching.stepping`, the server's scheduler) on a backend that
    batches, each step joins the batch's next forward pass, and every token is sampled on the host.
    """

    def __init__(self, model: Transformer, cache: KVCache, sampler: Sampler):
        self.backend = model.backend
        self.sampler = sampler
        batched = batched_step(model, cache.storage)
        self.step = batched or model.decode_step(cache.storage)
        backend, params = model.backend, sampler.params
        on_device = backend.device_tokens and not sampler.masks_tokens and batched is None
        self.argmax: Callable[[Any], Any] | None = None  # picks a token on the device, left there
        if on_device and argmax_only(params):
            self.argmax = backend.argmax
        elif on_device and backend.device_sampling and params.penalties_neutral and type(sampler) is Sampler:
            self.argmax = lambda logits: backend.sample_token(
                logits, params.temperature, params.top_k, params.top_p, params.min_p, sampler.rng.random()
            )  # the host sampler's own draw (`Generator.choice` takes one `random()` a token)

    @property
    def on_device(self) -> bool:
        """Whether tokens stay on the device (greedy decoding on a backend with `device_tokens`)."""
        return self.argmax is not None

    def queue(self, token: Any, position: int) -> Any:
        """Queue the step that feeds `token` (a host int, or a device token) at `position`;
        return what the token after it will be read from (`read`)."""
        logits = self.step(token, position)
        return self.argmax(logits) if self.argmax is not None else logits

    def read(self, pending: Any, history: list[int]) -> int:
        """The token `pending` stands for: read back from the device, or sampled on the host."""
        values = self.backend.to_host(pending)
        if self.argmax is not None:
            return int(values[0])
        return self.sampler.sample(values[-1], history)


def argmax_only(params: SamplingParams) -> bool:
    """Whether sampling with `params` is a plain argmax: greedy, with every penalty neutral."""
    return params.temperature <= 0.0 and params.penalties_neutral
