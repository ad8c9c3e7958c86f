"""Turning logits into the next token.

The steps run in llama.cpp's default order: penalties, top-k, top-p, min-p, temperature,
then a draw. A temperature of 0 means greedy decoding: the most likely token, always.
"""

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

    @classmethod
    def greedy(cls) -> "SamplingParams":
        """Settings for deterministic greedy decoding."""
        return cls(temperature=0.0)


class Sampler:
    """Draws tokens with a private random generator, so equal seeds give equal text."""

    def __init__(self, params: SamplingParams):
        self.params = params
        self.rng = np.random.default_rng(params.seed)

    def apply_penalties(self, logits: np.ndarray, history: list[int]) -> np.ndarray:
        """Repetition, presence and frequency penalties over the last `penalty_last_n` tokens."""
        p = self.params
        if not history or p.penalty_last_n == 0 or (
            p.repeat_penalty == 1.0 and p.presence_penalty == 0.0 and p.frequency_penalty == 0.0
        ):
            return logits
        window = history[-p.penalty_last_n:] if p.penalty_last_n > 0 else history
        ids, counts = np.unique(np.asarray(window, dtype=np.int64), return_counts=True)
        logits = logits.copy()
        seen = logits[ids]
        # The repetition penalty shrinks a logit's magnitude toward "less likely" on both signs.
        seen = np.where(seen > 0, seen / p.repeat_penalty, seen * p.repeat_penalty)
        seen -= counts * p.frequency_penalty + p.presence_penalty
        logits[ids] = seen
        return logits

    def sample(self, logits: np.ndarray, history: list[int] = ()) -> int:
        """Pick the next token id from float32 logits of shape (vocab,)."""
        p = self.params
        logits = self.apply_penalties(np.asarray(logits, dtype=np.float32), list(history))
        if p.temperature <= 0.0:
            return int(np.argmax(logits))

        candidates = np.argsort(-logits, kind="stable")
        if p.top_k > 0:
            candidates = candidates[: p.top_k]
        chosen = logits[candidates].astype(np.float64)
        probs = np.exp(chosen - chosen[0])
        probs /= probs.sum()
        if p.top_p < 1.0:
            keep = int(np.searchsorted(np.cumsum(probs), p.top_p)) + 1
            candidates, chosen, probs = candidates[:keep], chosen[:keep], probs[:keep]
        if p.min_p > 0.0:
            keep = probs >= p.min_p * probs[0]
            candidates, chosen = candidates[keep], chosen[keep]

        scaled = chosen / p.temperature
        weights = np.exp(scaled - scaled.max())
        return int(self.rng.choice(candidates, p=weights / weights.sum()))
