"""Token choice on the device (`backends/cuda/sampling_ops.py`)
on each test device (the CPU emulator; a GPU where one runs): argmax
exactly as np.argmax, and sampling token for token as a NumPy implementation of the host
sampler's rule (engine/sampling.py) for many uniform draws."""

import numpy as np
import pytest

from backends.cuda.sampling_ops import Sampling

RNG = np.random.default_rng(11)
DRAWS = 40  # uniform values per case, spread over [0, 1)


@pytest.fixture(scope="module")
def dev(device):
    """The device of this run (the emulator, then a GPU where one runs: conftest.py)."""
    return device


@pytest.fixture(scope="module")
def sampling(dev):
    return Sampling(dev)


def reference_token(logits: np.ndarray, temperature: float, top_k: int, top_p: float, min_p: float, u: float) -> int:
    """The host sampler's rule in float64: top-k, then top-p on the untempered probabilities of
    the pool, then min-p, largest first with ties by lower id (vocabulary order when neither
    top-k nor top-p is on); then the first token whose cumulative tempered weight exceeds u
    times the total (numpy's Generator.choice with p)."""
    top_k_on, top_p_on = 0 < top_k < logits.size, top_p < 1.0
    order = np.argsort(-logits, kind="stable") if top_k_on or top_p_on else np.arange(logits.size)
    if top_k_on:
        order = order[:top_k]
    chosen = logits[order].astype(np.float64)
    probs = np.exp(chosen - chosen.max())
    probs /= probs.sum()
    if top_p_on:
        keep = int(np.searchsorted(np.cumsum(probs), top_p)) + 1
        order, chosen, probs = order[:keep], chosen[:keep], probs[:keep]
    if min_p > 0.0:
        keep_mask = probs >= min_p * probs.max()
        order, chosen = order[keep_mask], chosen[keep_mask]
    cumulative = np.cumsum(np.exp((chosen - chosen.max()) / temperature))
    return int(order[np.searchsorted(cumulative, u * cumulative[-1], side="right")])


def _device_tokens(dev, sampling: Sampling, logits: np.ndarray, temperature, top_k, top_p, min_p, draws) -> list[int]:
    lp, out = dev.to_device(logits), dev.alloc(4)
    tokens = []
    for u in draws:
        sampling.sample(lp, logits.size, temperature, top_k, top_p, float(u), out, min_p=min_p)
        tokens.append(int(dev.from_device(out, (1,), np.int32)[0]))
    return tokens


def _draws() -> np.ndarray:
    spread = (np.arange(DRAWS // 2) + RNG.uniform(size=DRAWS // 2)) / (DRAWS // 2)  # one in each stratum
    return np.concatenate([spread, RNG.uniform(size=DRAWS - DRAWS // 2)]).astype(np.float32)


def _tied(vocab: int) -> np.ndarray:
    """Logits on a coarse grid: many equal values, so cuts fall inside runs of ties."""
    return (np.round(RNG.standard_normal(vocab) * 4) / 2).astype(np.float32)


@pytest.mark.parametrize("vocab", [1, 1000, 5003])
def test_argmax_first_of_ties(dev, sampling, vocab):
    logits = _tied(vocab)
    logits[[vocab // 3, vocab // 2, vocab - 1]] = logits.max() + 1.0  # three equal maxima
    out = dev.alloc(4)
    sampling.argmax(dev.to_device(logits), vocab, out)
    assert int(dev.from_device(out, (1,), np.int32)[0]) == int(np.argmax(logits))


def _masked(vocab: int, allowed: int) -> np.ndarray:
    """Logits of which only `allowed` random tokens are finite (a grammar's mask)."""
    logits = np.full(vocab, -np.inf, dtype=np.float32)
    logits[RNG.choice(vocab, allowed, replace=False)] = RNG.standard_normal(allowed) * 2
    return logits


CASES = {
    # (logits, temperature, top_k, top_p, min_p)
    "engine_defaults": (lambda: (RNG.standard_normal(5000) * 3).astype(np.float32), 0.7, 40, 0.95, 0.05),
    "gemma_vocabulary": (lambda: (RNG.standard_normal(262144) * 3).astype(np.float32), 0.7, 40, 0.95, 0.05),
    "top_p_only": (lambda: (RNG.standard_normal(3000) * 2).astype(np.float32), 1.0, 0, 0.9, 0.0),
    "ties_cut_in_a_run": (lambda: _tied(4000), 1.3, 50, 0.8, 0.0),
    "top_p_inside_ties": (lambda: _tied(2000), 0.8, 0, 0.6, 0.0),
    # too many tokens for shared memory: the descents run over the whole vocabulary
    "flat_top_p": (lambda: (RNG.standard_normal(6000) * 0.1).astype(np.float32), 1.0, 0, 0.99, 0.0),
    "large_top_k": (lambda: (RNG.standard_normal(6000) * 2).astype(np.float32), 0.9, 5000, 1.0, 0.0),
    # a constrained vocabulary: all but 30 tokens masked to -inf, fewer than top-k
    "masked_vocabulary": (lambda: _masked(1000, 30), 1.0, 50, 0.95, 0.0),
    # neither top-k nor top-p: vocabulary order, with and without min-p
    "vocabulary_order": (lambda: (RNG.standard_normal(3000) * 2).astype(np.float32), 1.0, 0, 1.0, 0.0),
    "min_p_only": (lambda: (RNG.standard_normal(3000) * 2).astype(np.float32), 0.5, 0, 1.0, 0.1),
}


@pytest.mark.parametrize("name", list(CASES))
def test_sample_matches_the_host_rule(dev, sampling, name):
    make, temperature, top_k, top_p, min_p = CASES[name]
    logits = make()
    draws = _draws()
    want = [reference_token(logits, temperature, top_k, top_p, min_p, float(u)) for u in draws]
    got = _device_tokens(dev, sampling, logits, temperature, top_k, top_p, min_p, draws)
    assert got == want
    assert len(set(want)) > 1 or top_k == 1  # the draws did choose among several tokens


def test_zero_temperature_is_greedy(dev, sampling):
    logits = _tied(700)
    assert _device_tokens(dev, sampling, logits, 0.0, 40, 0.9, 0.0, [0.99]) == [int(np.argmax(logits))]
