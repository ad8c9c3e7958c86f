"""The sampler: each mode and penalty against hand-worked expectations."""

import math
from collections import Counter

import numpy as np
import pytest

from engine.sampling import Sampler, SamplingParams, largest_first, nucleus_superset

PLAIN = dict(top_k=0, top_p=1.0, min_p=0.0)


def logits_for(probs):
    return np.log(np.asarray(probs, dtype=np.float32))


def draw(params, logits, n=3000, history=()):
    sampler = Sampler(params)
    return Counter(sampler.sample(logits, list(history)) for _ in range(n))


def test_greedy_is_argmax():
    logits = np.array([0.1, 3.0, 2.9, -1.0], dtype=np.float32)
    assert Sampler(SamplingParams.greedy()).sample(logits) == 1


def test_same_seed_same_tokens_different_seed_different_tokens():
    logits = logits_for([0.25] * 4)
    runs = []
    for seed in (7, 7, 8):
        sampler = Sampler(SamplingParams(temperature=1.0, seed=seed, **PLAIN))
        runs.append([sampler.sample(logits) for _ in range(50)])
    assert runs[0] == runs[1]
    assert runs[0] != runs[2]


def test_temperature_one_follows_the_distribution():
    probs = [0.5, 0.3, 0.2]
    counts = draw(SamplingParams(temperature=1.0, seed=1, **PLAIN), logits_for(probs), n=6000)
    for token, p in enumerate(probs):
        assert abs(counts[token] / 6000 - p) < 0.03


def test_low_temperature_sharpens():
    counts = draw(SamplingParams(temperature=0.25, seed=2, **PLAIN), logits_for([0.5, 0.3, 0.2]), n=3000)
    # p ∝ p_i^4: 0.0625, 0.0081, 0.0016 -> first token ~ 86%
    assert counts[0] / 3000 == pytest.approx(0.0625 / (0.0625 + 0.0081 + 0.0016), abs=0.03)


def test_top_k_keeps_only_the_k_best():
    counts = draw(SamplingParams(temperature=1.0, seed=3, top_k=2, top_p=1.0, min_p=0.0), logits_for([0.4, 0.3, 0.2, 0.1]))
    assert set(counts) == {0, 1}


def test_top_p_keeps_the_smallest_set_reaching_p():
    # cumulative 0.5, 0.8, 1.0: top_p 0.6 needs tokens 0 and 1.
    counts = draw(SamplingParams(temperature=1.0, seed=4, top_k=0, top_p=0.6, min_p=0.0), logits_for([0.5, 0.3, 0.2]))
    assert set(counts) == {0, 1}


def test_min_p_drops_tokens_below_a_fraction_of_the_best():
    # min_p 0.5 of 0.5 = 0.25: keeps 0.5 and 0.3, drops 0.2.
    counts = draw(SamplingParams(temperature=1.0, seed=5, top_k=0, top_p=1.0, min_p=0.5), logits_for([0.5, 0.3, 0.2]))
    assert set(counts) == {0, 1}


def test_repetition_penalty_divides_positive_and_multiplies_negative_logits():
    sampler = Sampler(SamplingParams(repeat_penalty=2.0))
    out = sampler.apply_penalties(np.array([2.0, -1.0, 5.0], dtype=np.float32), [0, 1, 1])
    np.testing.assert_allclose(out, [1.0, -2.0, 5.0])


def test_presence_and_frequency_penalties_subtract():
    sampler = Sampler(SamplingParams(presence_penalty=0.5, frequency_penalty=0.25))
    out = sampler.apply_penalties(np.zeros(3, dtype=np.float32), [2, 2, 2, 0])
    np.testing.assert_allclose(out, [-0.75, 0.0, -1.25])  # token 2: 3 * 0.25 + 0.5


def test_penalty_window_only_sees_recent_tokens():
    sampler = Sampler(SamplingParams(repeat_penalty=2.0, penalty_last_n=2))
    out = sampler.apply_penalties(np.array([4.0, 4.0, 4.0], dtype=np.float32), [0, 1, 2])
    np.testing.assert_allclose(out, [4.0, 2.0, 2.0])


def test_penalty_changes_the_greedy_choice():
    logits = np.array([3.0, 2.0], dtype=np.float32)
    assert Sampler(SamplingParams(temperature=0.0, repeat_penalty=2.0)).sample(logits, [0]) == 1
    assert math.isclose(float(logits[0]), 3.0)  # the caller's logits are not modified


# -- a Gemma-sized vocabulary: the candidates are found without sorting everything ----------

VOCAB = 262_144


def ranking(logits):
    """The reference order: a full stable sort, largest first (ties by lower id)."""
    return np.argsort(-logits, kind="stable")


def test_largest_first_matches_a_full_sort_even_with_ties():
    rng = np.random.default_rng(0)
    logits = np.round(rng.normal(size=VOCAB), 1).astype(np.float32)  # many equal values
    for k in (1, 40, 1000):
        np.testing.assert_array_equal(largest_first(logits, k), ranking(logits)[:k])


def test_nucleus_superset_is_a_short_prefix_of_the_ranking_holding_the_mass():
    rng = np.random.default_rng(1)
    plateau = np.full(VOCAB, -20.0, dtype=np.float32)
    plateau[rng.permutation(VOCAB)[:500]] = rng.uniform(0, 0.1, size=500)  # 500 near-equal best
    spread = (rng.normal(size=VOCAB) * 3).astype(np.float32)  # a nucleus of thousands
    for logits in (plateau, spread):
        weights = np.exp(logits.astype(np.float64))
        ranked = ranking(logits)
        for top_p in (0.05, 0.5, 0.9):
            candidates = nucleus_superset(logits, top_p)
            np.testing.assert_array_equal(candidates, ranked[: len(candidates)])
            assert weights[candidates].sum() >= top_p * weights.sum()
            exact = int(np.searchsorted(np.cumsum(weights[ranked]), top_p * weights.sum())) + 1
            assert len(candidates) <= max(2 * exact, 600)  # not the whole vocabulary


def test_top_k_on_a_large_vocabulary_draws_only_from_the_k_best():
    rng = np.random.default_rng(2)
    logits = rng.normal(size=VOCAB).astype(np.float32) * 3
    counts = draw(SamplingParams(temperature=1.0, seed=6, top_k=40, top_p=1.0, min_p=0.0), logits, n=1000)
    assert set(counts) <= set(ranking(logits)[:40].tolist())
    assert len(counts) > 10  # and really draws among them


def test_top_p_on_a_large_vocabulary_keeps_the_whole_nucleus():
    # 300 equal tokens hold 0.96 of the mass: top-p 0.5 keeps the best ~157 of them (by id
    # among ties), which needs the search past the first 64 candidates.
    logits = np.full(VOCAB, -30.0, dtype=np.float32)
    plateau = np.arange(1000, 1300)
    logits[plateau] = 0.0
    mass = np.exp(logits.astype(np.float64))
    mass /= mass.sum()
    nucleus = int(np.searchsorted(np.cumsum(mass[ranking(logits)]), 0.5)) + 1  # worked out independently
    counts = draw(SamplingParams(temperature=1.0, seed=7, top_k=0, top_p=0.5, min_p=0.0), logits, n=600)
    assert set(counts) <= set(plateau[:nucleus].tolist())
    assert max(counts) > plateau[64]  # tokens beyond the first 64 candidates were drawn


@pytest.mark.parametrize(
    ("changes", "neutral"),
    [
        ({}, True),
        ({"repeat_penalty": 1.1}, False),
        ({"presence_penalty": 0.5}, False),
        ({"frequency_penalty": -0.5}, False),
        ({"repeat_penalty": 1.3, "presence_penalty": 1.0, "penalty_last_n": 0}, True),  # an empty window
    ],
)
def test_penalties_are_neutral_only_when_they_change_nothing(changes, neutral):
    params = SamplingParams(**changes)
    assert params.penalties_neutral is neutral
    logits = np.array([2.0, -1.0, 0.5], np.float32)
    penalised = Sampler(params).apply_penalties(logits, [0, 1, 1])
    assert np.array_equal(penalised, logits) is neutral
