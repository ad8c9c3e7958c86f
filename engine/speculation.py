"""Speculative decoding: which drafter, how many tokens to draft, and what checking them costs.

`Speculation` is the setting a caller passes to `generate`: a mode ("off", "auto",
"ngram", "draft"), an optional fixed draft length, and the draft model for "draft". It
builds the token source of `engine.decoding` for each answer and keeps the controller's
estimates from one answer to the next.

Never slower: checking T tokens in one pass costs c(T) steps (measured once per model by
`measure_costs`). `AdaptiveController` tracks how often the draft at each position is
accepted, picks the draft length with the most expected tokens per unit of cost, drafts
nothing (a plain step) when no length beats plain decoding, and probes again later.

A model with recurrent layers (Qwen3.5's Gated DeltaNet) cannot forget a rejected draft: the
cache restores a snapshot of the recurrent state and reads the accepted tokens again
(`KVCache.truncate`). The controller counts that rollback in each length's cost, and where
even drafts that are nearly always right would not pay with it, `Speculation.prepare` turns
drafting off for the model and says why (`Speculation.off_because`).
"""

import time
import weakref
from collections.abc import Generator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from engine.decoding import Drafter, DraftStats, speculative_tokens
from engine.draft_model import DraftModelDrafter, draft_refusals
from engine.errors import DraftModelError
from engine.kv_cache import KVCache
from engine.models.common import Transformer
from engine.ngram import NgramDrafter
from engine.sampling import Sampler, SamplingParams

MODES = ("off", "auto", "ngram", "draft")
MAX_DRAFT = 8  # the longest draft the adaptive controller considers


@dataclass(frozen=True)
class VerifyCosts:
    """c(T): the time of one forward pass over T tokens, in plain decode steps; c[0] is c(1) = 1.

    `step_seconds` is the plain step's time the ratios are relative to. `restore`, for a model
    with recurrent layers, is what restoring their snapshot after a rejected draft costs, in
    plain steps (the accepted tokens are then read again, a pass of their own); None where a
    rollback only forgets positions, which costs next to nothing.
    """

    ratios: tuple[float, ...]
    step_seconds: float
    restore: float | None = None

    def __call__(self, n_tokens: int) -> float:
        """c(n_tokens); past the measured range, grown linearly from the last two."""
        if n_tokens <= len(self.ratios):
            return self.ratios[n_tokens - 1]
        last, before = self.ratios[-1], self.ratios[-2] if len(self.ratios) > 1 else 0.0
        return last + (n_tokens - len(self.ratios)) * max(last - before, 0.0)


_measured: "weakref.WeakKeyDictionary[Transformer, VerifyCosts]" = weakref.WeakKeyDictionary()


def measure_costs(
    model: Transformer, cache: KVCache, longest: int = MAX_DRAFT + 1, rounds: int = 2, prompt: int = 16
) -> VerifyCosts:
    """Time passes over 1, 2, 4, ... (up to half of `longest`) and `longest` tokens after a short prompt,
    interleaved, best of `rounds`; c(T) between two measured lengths is interpolated
    linearly (it grows about linearly past T = 2, and measuring every length would make
    loading a large model seconds slower). For a model with recurrent layers, the rollback
    after each pass of two or more tokens is timed too (a snapshot restored), best of all.

    Kept per model: the first call measures, the others return the same figures. `cache`
    is a scratch cache with room for `prompt` + `longest` positions; it is left empty.
    """
    known = _measured.get(model)
    if known is not None and len(known.ratios) >= longest:
        return known
    lengths = sorted({1, longest, *(2**i for i in range(1, longest.bit_length()) if 2 * 2**i <= longest)})
    tokens = list(range(1, 1 + prompt + longest))
    cache.truncate(0)
    cache.feed(model, tokens[:prompt])
    best = dict.fromkeys(lengths, float("inf"))
    restore = float("inf")
    for _ in range(rounds):
        for n in lengths:
            began = time.perf_counter()
            cache.feed(model, tokens[prompt : prompt + n], all_logits=True)
            fed = time.perf_counter()
            cache.truncate(prompt)
            best[n] = min(best[n], fed - began)
            if n > 1:
                restore = min(restore, time.perf_counter() - fed)
    cache.truncate(0)
    step = best[1]
    ratios = np.interp(np.arange(1, longest + 1), lengths, [best[n] / step for n in lengths])
    rollback = restore / step if cache.recurrent and restore < float("inf") else None
    costs = VerifyCosts(tuple(float(r) for r in ratios), step, rollback)
    _measured[model] = costs
    return costs


class FixedLength:
    """Always `k` drafts (the user chose the length)."""

    def __init__(self, k: int):
        self.k = k

    def choose(self, most: int) -> int:
        """`k`, or fewer where the answer or the context has less room."""
        return min(self.k, most)

    def record(self, drafted: int, accepted: int) -> None:
        """Nothing to learn."""

    def timed(self, n_tokens: int, seconds: float) -> None:
        """Nothing to learn."""


@dataclass
class AdaptiveController:
    """Picks each round's draft length from acceptance so far and the measured c(T).

    The chance that the draft at position i is accepted when the ones before it were is
    (hits + 2 * prior) / (trials + 2) at that position, over the rounds that reached it,
    older rounds weighing less (each round multiplies the counts by `memory`); the prior is
    position i - 1's estimate (0.5 for position 0), so a position never tried yet is
    expected to do as well as the one before it. With k drafts a round
    yields 1 + sum over j <= k of accept(0) * ... * accept(j - 1) tokens on average and
    costs c(k + 1) + k * `draft_cost` steps; for a model with recurrent layers (`costs.restore`
    set), also, for each a < k, the chance that exactly a drafts are accepted times the
    rollback that follows: the snapshot's restore plus c(a + 1), the pass that reads the last
    token and the a accepted drafts again. c(T) starts as measured at load (`costs`) and,
    with `follow_timing`, follows what rounds of T and of 1 token take in the answers'
    contexts once both have run (a moving average of each, `seconds`; the first round of
    each length is left out, as it may include recording the pass), which a short prompt
    at load may not show. When no k > 0 beats one token per step by `margin` (the estimates
    are estimates: a draft expected to win by less is as likely to lose), the
    controller drafts nothing; after `probe_after` such rounds it drafts once, to see
    whether the text has become predictable (the wait doubles after each probe that did
    not pay, up to `longest_wait`). A probe drafts the fewest tokens that would pay if drafts
    were right `hopeful` of the time (one, unless checks are dear), so a probe that fails
    costs as little as a probe can; one that is right is followed by another at once, until
    the estimates say drafting pays (the positions after a right one are expected to do as
    well, so the rounds after it draft longer) or a probe fails. Where even such drafts would not
    pay, it never probes.
    """

    costs: VerifyCosts
    longest: int = MAX_DRAFT
    draft_cost: float = 0.0
    memory: float = 0.95
    probe_after: int = 16
    longest_wait: int = 512
    hopeful: float = 0.9
    margin: float = 1.05
    follow_timing: bool = True
    seconds: dict[int, float] = field(default_factory=dict)
    first_rounds: set[int] = field(default_factory=set)
    hits: list[float] = field(default_factory=list)
    trials: list[float] = field(default_factory=list)
    plain_rounds: int = 0
    wait: int = 0

    def __post_init__(self):
        self.hits = self.hits or [0.0] * self.longest
        self.trials = self.trials or [0.0] * self.longest
        self.wait = self.wait or self.probe_after

    def acceptance(self) -> list[float]:
        """The estimated chance that draft i is accepted given that drafts 0 .. i-1 were, for each i."""
        estimates, prior = [], 0.5
        for hits, trials in zip(self.hits, self.trials, strict=True):
            prior = (hits + 2.0 * prior) / (trials + 2.0)
            estimates.append(prior)
        return estimates

    def expected_gain(self, k: int, acceptance: Sequence[float] | None = None) -> float:
        """Expected tokens per unit of cost with `k` drafts, relative to plain decoding (1.0),
        with the estimated acceptance per position (or `acceptance`)."""
        reach, tokens, rollbacks = 1.0, 1.0, 0.0
        for accepted, chance in enumerate((self.acceptance() if acceptance is None else acceptance)[:k]):
            if self.costs.restore is not None:  # exactly `accepted` drafts kept: restore, read them again
                rollbacks += reach * (1.0 - chance) * (self.costs.restore + self.cost(accepted + 1))
            reach *= chance
            tokens += reach
        return tokens / (self.cost(k + 1) + k * self.draft_cost + rollbacks)

    def cost(self, n_tokens: int) -> float:
        """c(n_tokens): a round of `n_tokens` in plain steps, as timed here if both were, else as measured at load."""
        if n_tokens in self.seconds and 1 in self.seconds:
            return self.seconds[n_tokens] / self.seconds[1]
        return self.costs(n_tokens)

    def timed(self, n_tokens: int, seconds: float) -> None:
        """Fold a round's time into the moving average for its length (but a length's first)."""
        if not self.follow_timing:
            return
        if n_tokens not in self.first_rounds:
            self.first_rounds.add(n_tokens)
            return
        known = self.seconds.get(n_tokens)
        self.seconds[n_tokens] = seconds if known is None else known + 0.2 * (seconds - known)

    def ever_pays(self) -> bool:
        """Whether some draft length would pay (by `margin`) with drafts right `hopeful` of the time."""
        return self.probe_length(self.longest) > 0

    def probe_length(self, top: int) -> int:
        """The draft length of a probe, up to `top`: the shortest that would pay (by `margin`) with
        drafts right `hopeful` of the time; 0 if none would."""
        hoped = [self.hopeful] * self.longest
        return next((k for k in range(1, top + 1) if self.expected_gain(k, hoped) >= self.margin), 0)

    def choose(self, most: int) -> int:
        """The best draft length up to `most`; 0 when plain decoding wins, but for a probe."""
        top = min(self.longest, most)
        estimates = self.acceptance()
        best = max(range(top + 1), key=lambda k: (self.expected_gain(k, estimates), -k))
        if top == 0 or self.expected_gain(best, estimates) >= self.margin:
            return best
        self.plain_rounds += 1
        if self.plain_rounds < self.wait:
            return 0
        self.plain_rounds = 0
        self.wait = min(self.wait * 2, self.longest_wait)
        return self.probe_length(top)

    def record(self, drafted: int, accepted: int) -> None:
        """Count the positions this round reached: accepted ones as hits, the first rejected one as a miss."""
        self.hits = [h * self.memory for h in self.hits]
        self.trials = [t * self.memory for t in self.trials]
        for i in range(min(drafted, accepted + 1, self.longest)):
            self.trials[i] += 1.0
            self.hits[i] += 1.0 if i < accepted else 0.0
        estimates = self.acceptance()
        if any(self.expected_gain(k, estimates) >= self.margin for k in range(1, self.longest + 1)):
            self.wait = self.probe_after
        elif accepted == drafted:  # a probe that was right all along: undo its doubling, probe again next round
            self.wait = max(self.wait // 2, self.probe_after)
            self.plain_rounds = self.wait


@dataclass
class Speculation:
    """How answers are decoded.

    `mode`: "off" (plain decoding), "ngram" (prompt lookup), "draft" (the draft model
    `draft`, a LoadedModel checked with `check_draft`), or "auto": the draft model if one is
    set, else prompt lookup, with the adaptive controller deciding each round whether
    drafting pays. `draft_tokens` fixes the draft length (None: the controller chooses, up
    to MAX_DRAFT; in "auto" the controller always chooses).

    `off_because`, set by `prepare`: why drafting is off for the model although the mode asks
    for it (a model with recurrent layers whose rollbacks cost more than drafting gains).
    """

    mode: str = "auto"
    draft_tokens: int | None = None
    draft: Any = None
    controller: AdaptiveController | FixedLength | None = field(default=None, repr=False)
    off_because: str | None = None
    _draft_drafter: DraftModelDrafter | None = field(default=None, repr=False)

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"unknown speculative mode {self.mode!r}; choose one of {', '.join(MODES)}")
        if self.draft_tokens is not None and not 1 <= self.draft_tokens <= 32:
            raise ValueError(f"the draft length must be between 1 and 32, not {self.draft_tokens}")
        if self.mode == "draft" and self.draft is None:
            raise ValueError("speculative mode 'draft' needs a draft model (--draft-model)")
        if self.draft_tokens is not None and self.mode != "auto":
            self.controller = FixedLength(self.draft_tokens)

    @property
    def enabled(self) -> bool:
        """Whether answers are decoded speculatively."""
        return self.mode != "off" and self.off_because is None

    def tokens(
        self,
        model: Transformer,
        cache: KVCache,
        logits: np.ndarray,
        sampler: Sampler,
        prompt: Sequence[int],
        limit: int,
        stats: DraftStats,
    ) -> Generator[int, None, None]:
        """The token source of one answer (see `engine.decoding.speculative_tokens`)."""
        self.prepare(model)
        drafter = self.new_drafter(model, cache.n_ctx, sampler.params)
        assert self.controller is not None  # made by prepare
        return speculative_tokens(model, cache, logits, sampler, prompt, limit, drafter, self.controller, stats)

    def prepare(self, model: Transformer) -> None:
        """Make the adaptive controller, measuring c(T) for `model` (and the draft model's step) once;
        turn drafting off (`off_because`) where rolling back a recurrent state makes every length lose."""
        if self.controller is not None:
            return
        costs = measure_costs(model, scratch_cache(model))
        draft_cost = 0.0
        if self.draft is not None and self.mode != "ngram":
            draft_step = measure_costs(self.draft.model, scratch_cache(self.draft.model), 1).step_seconds
            draft_cost = draft_step / costs.step_seconds
        self.controller = AdaptiveController(costs, draft_cost=draft_cost)
        if costs.restore is not None and not self.controller.ever_pays():
            self.off_because = (
                "speculative decoding is off for this model: undoing a rejected draft restores its recurrent "
                f"state ({costs.restore:.2f} steps) and reads the kept tokens again, and with that counted no "
                f"draft length pays (checking 2 tokens costs {costs(2):.2f} steps)"
            )

    def new_drafter(self, model: Transformer, n_ctx: int, params: SamplingParams) -> Drafter:
        """The drafter of one answer: prompt lookup anew, or the draft model with the cache it keeps."""
        if self.draft is None or self.mode == "ngram":
            return NgramDrafter()
        if self._draft_drafter is None or self._draft_drafter.cache.n_ctx != n_ctx:
            self._draft_drafter = DraftModelDrafter(self.draft.model, n_ctx, params, model.config.vocab_size)
        self._draft_drafter.retarget(params)
        return self._draft_drafter


def check_draft(target: Any, draft: Any) -> None:
    """Raise DraftModelError unless the loaded model `draft` can draft for the loaded `target`."""
    reasons = draft_refusals(target.file.metadata, draft.file.metadata)
    if reasons:
        raise DraftModelError(f"{draft.path.name} cannot draft for {target.path.name}: " + "; ".join(reasons) + ".")


def scratch_cache(model: Transformer) -> KVCache:
    """A small cache to time forward passes in (see `measure_costs`)."""
    return KVCache(model, 16 + MAX_DRAFT + 1)
