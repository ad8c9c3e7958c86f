"""Turning logits into the next token.

The steps run in llama.cpp's default order: penalties, top-k, top-p, min-p, temperature,
then a draw. A temperature of 0 means greedy decoding: the most likely token, always.
"""

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class SamplingParams:
    """Sampler settings. Zeros switch a step off (top_k=0, top_p=1, min_p=0, penalties neutral)."""

    temperature: float = 0.7
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    penalty_last_n: int = 64
    seed: int | None = None

    @property
    def penalties_neutral(self) -> bool:
        """Whether the penalties leave every logit as it is (none set, or a window of 0 tokens)."""
        return self.penalty_last_n == 0 or (
            self.repeat_penalty == 1.0 and self.presence_penalty == 0.0 and self.frequency_penalty == 0.0
        )

    @classmethod
    def greedy(cls) -> "SamplingParams":
        """Settings for deterministic greedy decoding."""
        return cls(temperature=0.0)


class Sampler:
    """Draws tokens with a private random generator, so equal seeds give equal text."""

    masks_tokens = False  # True in subclasses that forbid tokens: they need every step's logits

    def __init__(self, params: SamplingParams):
        self.params = params
        self.rng = np.random.default_rng(params.seed)

    def apply_penalties(self, logits: np.ndarray, history: list[int]) -> np.ndarray:
        """Repetition, presence and frequency penalties over the last `penalty_last_n` tokens."""
        p = self.params
        if not history or p.penalties_neutral:
            return logits
        window = history[-p.penalty_last_n :] if p.penalty_last_n > 0 else history
        ids, counts = np.unique(np.asarray(window, dtype=np.int64), return_counts=True)
        logits = logits.copy()
        seen = logits[ids]
        # The repetition penalty shrinks a logit's magnitude toward "less likely" on both signs.
        seen = np.where(seen > 0, seen / p.repeat_penalty, seen * p.repeat_penalty)
        seen -= counts * p.frequency_penalty + p.presence_penalty
        logits[ids] = seen
        return logits

    def sample(self, logits: np.ndarray, history: Sequence[int] = ()) -> int:
        """Pick the next token id from float32 logits of shape (vocab,)."""
        logits = self.apply_penalties(np.asarray(logits, dtype=np.float32), list(history))
        if self.params.temperature <= 0.0:
            return int(np.argmax(logits))
        candidates, probs = self._final(logits)
        return int(self.rng.choice(candidates, p=probs))

    def distribution(self, logits: np.ndarray, history: Sequence[int] = ()) -> np.ndarray:
        """The final distribution `sample` draws from, over the whole vocabulary: (vocab,) float64.

        Greedy decoding puts all the mass on the argmax.
        """
        logits = self.apply_penalties(np.asarray(logits, dtype=np.float32), list(history))
        full = np.zeros(logits.size, dtype=np.float64)
        if self.params.temperature <= 0.0:
            full[int(np.argmax(logits))] = 1.0
            return full
        candidates, probs = self._final(logits)
        full[candidates] = probs
        return full

    def _final(self, logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The tokens that survive top-k, top-p and min-p, and their probabilities after temperature."""
        p = self.params
        pool = p.top_k if 0 < p.top_k < logits.size else logits.size
        if pool < logits.size:
            candidates = largest_first(logits, pool)
        elif p.top_p < 1.0:
            candidates = nucleus_superset(logits, p.top_p)
        else:
            candidates = np.arange(logits.size)  # every token stays: no order needed
        chosen = logits[candidates].astype(np.float64)
        # Probabilities over the whole top-k pool (the vocabulary when top-k is off), even
        # when `candidates` is only the part of it that can hold the top-p mass.
        pool_logits = chosen if pool < logits.size else logits.astype(np.float64)
        top = chosen.max()
        probs = np.exp(chosen - top) / np.exp(pool_logits - top).sum()
        if p.top_p < 1.0:
            keep = int(np.searchsorted(np.cumsum(probs), p.top_p)) + 1
            candidates, chosen, probs = candidates[:keep], chosen[:keep], probs[:keep]
        if p.min_p > 0.0:
            keep = probs >= p.min_p * probs.max()
            candidates, chosen = candidates[keep], chosen[keep]

        scaled = chosen / p.temperature
        weights = np.exp(scaled - scaled.max())
        return candidates, weights / weights.sum()


def largest_first(logits: np.ndarray, k: int) -> np.ndarray:
    """Ids of the `k` largest logits, largest first, ties by lower id.

    A partition then a sort of `k` items, the same ids a full stable sort would give: for
    top-k 40 over Gemma's 262k vocabulary far cheaper than sorting everything.
    """
    if k >= logits.size:
        return np.argsort(-logits, kind="stable")
    kth = np.partition(logits, logits.size - k)[logits.size - k]  # the k-th largest value
    above = np.flatnonzero(logits > kth)
    ids = np.concatenate([above, np.flatnonzero(logits == kth)[: k - above.size]])
    return ids[np.lexsort((ids, -logits[ids]))]


def nucleus_superset(logits: np.ndarray, top_p: float, refinements: int = 8) -> np.ndarray:
    """The largest logits, largest first, enough of them to hold `top_p` of the mass.

    Rather than sorting the whole vocabulary, this finds a threshold below the best logit
    that keeps the mass: doubling the drop (1, 2, 4, ... nats) until it is enough, then
    bisecting `refinements` times, and sorts only the tokens above it. Ties are all in or
    all out of such a set, so the result is a prefix of the full stable sort.
    """
    top = logits.max()
    weights = np.exp(logits.astype(np.float64) - top)
    needed = top_p * weights.sum()

    def holds_the_mass(drop: float) -> bool:
        return weights[logits >= top - drop].sum() >= needed

    short, enough = 0.0, 1.0
    while not holds_the_mass(enough):
        short, enough = enough, enough * 2
    for _ in range(refinements):
        middle = (short + enough) / 2
        short, enough = (short, middle) if holds_the_mass(middle) else (middle, enough)
    above = np.flatnonzero(logits >= top - enough)
    return above[np.argsort(-logits[above], kind="stable")]
