"""Sampled drafts under the standard accept rule: the answers' distribution equals plain decoding's.

A draft distribution q (another prefix-hashed model) proposes tokens; the verifier accepts
with min(1, p/q), redraws from max(0, p - q) on rejection, and draws a bonus token after a
full run. Over a small vocabulary, every sequence of a few tokens has an exact probability
under the target's own sampling (computed here with a plain softmax, independently of the
sampler), and a chi-square test compares the counts of speculative answers with it. The
test checks its own power: the statistic a broken rule (accept every draft) would give.
"""

import itertools
import math
from dataclasses import replace

import numpy as np
import pytest

from engine.decoding import Draft
from engine.generation import generate
from engine.kv_cache import KVCache
from engine.sampling import SamplingParams
from engine.speculation import Speculation
from tests.engine.prefix_model import CharTokenizer, PrefixModel

PROMPT = [1, 2, 0, 1]
SALT = 99  # the draft model's logits: the target's function of the prefix with this token added


def softmax(x):
    e = np.exp(x - x.max())
    return e / e.sum()


def final_probs(logits: np.ndarray, temperature: float, top_k: int) -> np.ndarray:
    """Top-k (0: off), then temperature, as a plain softmax over the survivors."""
    logits = logits.astype(np.float64)
    if top_k:
        logits = np.where(logits >= np.sort(logits)[-top_k], logits, -np.inf)
    return softmax(logits / temperature)


class SampledDrafter:
    """Draws each draft from q at its position and says so (`Draft.probs`)."""

    def __init__(self, model: PrefixModel, temperature: float, top_k: int, seed: int):
        self.model, self.temperature, self.top_k = model, temperature, top_k
        self.rng = np.random.default_rng(seed)

    def q(self, prefix) -> np.ndarray:
        return final_probs(self.model.logits_after(np.append(prefix, SALT)), self.temperature, self.top_k)

    def propose(self, history, k):
        tokens, probs = [], []
        for _ in range(k):
            q = self.q(list(history) + tokens)
            tokens.append(int(self.rng.choice(q.size, p=q)))
            probs.append(q)
        return Draft(tokens, np.array(probs))


class Sampled(Speculation):
    def __init__(self, drafter, draft_tokens):
        super().__init__("ngram", draft_tokens)
        self.drafter = drafter

    def new_drafter(self, model, n_ctx, params):
        return self.drafter


def chi_square_critical(df: int, z: float = 3.09) -> float:
    """The chi-square quantile at the normal quantile z (3.09: 0.999), by Wilson and Hilferty."""
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


@pytest.mark.parametrize(
    "vocab,temperature,top_k,n_tokens,draft_tokens,rounds",
    [
        (3, 1.0, 0, 4, 2, 1500),  # 81 sequences; drafts of 2, a bonus after a full run
        (4, 0.7, 3, 3, 1, 2000),  # top-k 3 of 4: zeros in p and q
    ],
)
def test_speculative_sampling_keeps_the_target_distribution(vocab, temperature, top_k, n_tokens, draft_tokens, rounds):
    model = PrefixModel(vocab=vocab, spread=1.5, eos_bias=0.0)
    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=1.0, min_p=0.0, seed=1234)
    drafter = SampledDrafter(model, temperature, top_k, seed=5)
    speculation = Sampled(drafter, draft_tokens)
    cache = KVCache(model, 32)
    counts: dict[tuple, int] = {}
    drafted = accepted = 0
    for i in range(rounds):
        cache.truncate(0)
        run = list(
            generate(
                model,
                CharTokenizer(vocab),
                cache,
                PROMPT,
                replace(params, seed=i),
                max_tokens=n_tokens,
                ignore_stop_tokens=True,
                speculation=speculation,
            )
        )
        key = tuple(e.token for e in run)
        counts[key] = counts.get(key, 0) + 1
        drafted += run[-1].metrics.drafted_tokens
        accepted += run[-1].metrics.accepted_tokens
    assert 0.2 < accepted / drafted < 0.9, "drafts must be both accepted and rejected for the test to mean much"

    def p(prefix):
        return final_probs(model.logits_after(np.asarray(prefix)), temperature, top_k)

    def sequence_probability(seq, drafted_positions=()):
        """P(seq) under the target; positions in `drafted_positions` drawn from q instead."""
        prob = 1.0
        for j, token in enumerate(seq):
            prefix = PROMPT + list(seq[:j])
            dist = drafter.q(prefix) if j in drafted_positions else p(prefix)
            prob *= dist[token]
        return prob

    sequences = [s for s in itertools.product(range(vocab), repeat=n_tokens) if sequence_probability(s) > 0]
    assert sum(counts.get(s, 0) for s in sequences) == rounds, "an answer came out that the target gives probability 0"
    expected = np.array([sequence_probability(s) for s in sequences]) * rounds
    observed = np.array([counts.get(s, 0) for s in sequences])
    statistic, df = chi_square(observed, expected)
    critical = chi_square_critical(df)
    assert statistic < critical, f"chi-square {statistic:.1f} over {df} df (critical {critical:.1f})"

    # Power: accepting every draft would give drafted positions q's distribution instead of p's.
    broken = np.array([sequence_probability(s, range(1, 1 + draft_tokens)) for s in sequences]) * rounds
    noncentrality, _ = chi_square(broken, expected)
    assert noncentrality > 3 * critical, "the test has too few rounds to see a broken rule"


def chi_square(observed: np.ndarray, expected: np.ndarray) -> tuple[float, int]:
    """Pearson's statistic and its degrees of freedom, the cells expecting fewer than 5 pooled."""
    small = expected < 5
    observed = np.append(observed[~small], observed[small].sum())
    expected = np.append(expected[~small], expected[small].sum())
    return float(((observed - expected) ** 2 / expected).sum()), len(expected) - 1
