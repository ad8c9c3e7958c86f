"""Speculative decoding gives plain decoding's answers, on a model whose logits are an exact
function of the prefix (tests/engine/prefix_model.py).

Deterministic drafts are checked by sample-and-match, so speculative output must equal plain
output token for token, for greedy and seeded sampling alike, and leave the same KV cache.
The drafters here are inputs to the verifier: always right (they read the plain answer),
always wrong, random, partly right, and the real n-gram drafter.
"""

import threading

import numpy as np
import pytest

from engine.decoding import Draft
from engine.generation import (
    FINISH_CANCELLED,
    FINISH_CONTEXT_FULL,
    FINISH_LENGTH,
    FINISH_STOP_STRING,
    FINISH_STOP_TOKEN,
    generate,
)
from engine.kv_cache import KVCache
from engine.sampling import SamplingParams
from engine.speculation import AdaptiveController, Speculation, VerifyCosts
from tests.engine.prefix_model import EOS, VOCAB, CharTokenizer, PrefixModel

PROMPT = [5, 6, 7, 8, 5, 6, 7, 9, 3, 4, 5, 6]
PARAMS = {
    "greedy": SamplingParams.greedy(),
    "greedy-penalties": SamplingParams(
        temperature=0.0, repeat_penalty=1.3, presence_penalty=0.4, frequency_penalty=0.2, penalty_last_n=8
    ),
    "seeded": SamplingParams(temperature=0.9, top_k=0, top_p=1.0, min_p=0.0, seed=7),
    "seeded-topk-topp-minp": SamplingParams(temperature=0.8, top_k=6, top_p=0.9, min_p=0.1, seed=11),
    "seeded-penalties": SamplingParams(
        temperature=1.1,
        top_k=10,
        top_p=0.95,
        min_p=0.05,
        repeat_penalty=1.2,
        frequency_penalty=0.3,
        penalty_last_n=16,
        seed=3,
    ),
}


class Oracle:
    """Always right: proposes the next tokens of the plain answer (`reference`, prompt included)."""

    def __init__(self, reference: list[int], wrong_at: int | None = None, rng=None):
        self.reference, self.wrong_at, self.rng = reference, wrong_at, rng

    def propose(self, history, k):
        assert list(history) == self.reference[: len(history)], "the speculative answer left the plain one"
        tokens = self.reference[len(history) : len(history) + k]
        if self.rng is not None and tokens:  # partly right: one wrong token at a random place
            i = int(self.rng.integers(len(tokens)))
            tokens[i] = (tokens[i] + 1 + int(self.rng.integers(VOCAB - 1))) % VOCAB
        return Draft(tokens)


class Wrong(Oracle):
    """Always wrong: every proposal differs from the plain answer's token."""

    def propose(self, history, k):
        return Draft([(t + 1) % VOCAB for t in super().propose(history, k).tokens])


class Random:
    """Random tokens."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)

    def propose(self, history, k):
        return Draft(self.rng.integers(0, VOCAB, size=k).tolist())


class WithDrafter(Speculation):
    """Speculation with a drafter given by the test."""

    def __init__(self, make_drafter, draft_tokens=None):
        super().__init__("ngram", draft_tokens)
        self.make_drafter = make_drafter

    def new_drafter(self, model, n_ctx, params):
        return self.make_drafter()


def run(model, params, *, speculation=None, n_ctx=200, prompt=PROMPT, cancel_after=None, **kwargs):
    """Events of one answer, the cache tokens and the cache storage afterwards."""
    cache = KVCache(model, n_ctx)
    cancel = threading.Event()
    events = []
    for event in generate(
        model, CharTokenizer(), cache, prompt, params, speculation=speculation, cancel=cancel, **kwargs
    ):
        events.append(event)
        if cancel_after is not None and len(events) == cancel_after:
            cancel.set()
    return events, cache


def answer(events):
    return [(e.text, e.token, e.finish_reason) for e in events]


def reference_for(model, params, n=80):
    """The plain answer, run on past its end so a drafter can propose beyond it."""
    events, _ = run(model, params, max_tokens=n, ignore_stop_tokens=True)
    return PROMPT + [e.token for e in events]


def assert_same(plain, spec):
    (plain_events, plain_cache), (spec_events, spec_cache) = plain, spec
    assert answer(spec_events) == answer(plain_events)
    assert spec_cache.tokens == plain_cache.tokens
    np.testing.assert_array_equal(spec_cache.storage.tokens, plain_cache.storage.tokens)


DRAFTERS = {
    "right": lambda ref: Oracle(ref),
    "wrong": lambda ref: Wrong(ref),
    "random": lambda ref: Random(1),
    "partly-right": lambda ref: Oracle(ref, rng=np.random.default_rng(2)),
}


@pytest.mark.parametrize("params_name", list(PARAMS))
@pytest.mark.parametrize("drafter", list(DRAFTERS))
@pytest.mark.parametrize("draft_tokens", [1, 4, 9])
def test_speculative_answer_equals_plain_token_for_token(params_name, drafter, draft_tokens):
    model, params = PrefixModel(), PARAMS[params_name]
    ref = reference_for(model, params)
    plain = run(model, params, max_tokens=60)
    model.passes.clear()
    spec = run(model, params, max_tokens=60, speculation=WithDrafter(lambda: DRAFTERS[drafter](ref), draft_tokens))
    assert_same(plain, spec)
    assert max(model.passes[1:]) == draft_tokens + 1, "drafts must be checked in one pass (after the prefill)"
    if drafter == "right":
        assert len(model.passes) <= -(-len(spec[0]) // (draft_tokens + 1)) + 2  # a pass per full run


@pytest.mark.parametrize("params_name", ["greedy", "seeded-topk-topp-minp"])
def test_ngram_and_auto_answers_equal_plain(params_name):
    model, params = PrefixModel(spread=4.0), PARAMS[params_name]
    prompt = PROMPT * 4  # a text that repeats gives the n-gram drafter matches
    plain = run(model, params, max_tokens=60, prompt=prompt)
    for speculation in (Speculation("ngram", 4), Speculation("auto")):
        assert_same(plain, run(model, params, max_tokens=60, prompt=prompt, speculation=speculation))


# -- ends inside an accepted run -----------------------------------------------------------


@pytest.mark.parametrize("params_name", ["greedy", "seeded"])
def test_end_of_text_inside_an_accepted_run(params_name):
    model, params = PrefixModel(eos_bias=1.5), PARAMS[params_name]
    ref = reference_for(model, params)
    end = ref.index(EOS, len(PROMPT))
    plain = run(model, params, max_tokens=80)
    assert plain[0][-1].finish_reason == FINISH_STOP_TOKEN and len(plain[0]) == end - len(PROMPT) + 1
    for k in (3, 8):  # the oracle proposes past the end-of-text token
        assert_same(plain, run(model, params, max_tokens=80, speculation=WithDrafter(lambda: Oracle(ref), k)))


def test_stop_string_inside_an_accepted_run():
    model, params = PrefixModel(), PARAMS["greedy"]
    ref = reference_for(model, params)
    text = "".join(chr(ord("a") + t) for t in ref[len(PROMPT) :])
    stop = text[20:23]  # three letters well inside the answer
    plain = run(model, params, max_tokens=60, stop_strings=[stop])
    assert plain[0][-1].finish_reason == FINISH_STOP_STRING
    assert_same(
        plain, run(model, params, max_tokens=60, stop_strings=[stop], speculation=WithDrafter(lambda: Oracle(ref), 8))
    )


@pytest.mark.parametrize("max_tokens", [1, 2, 7, 13])
def test_max_tokens_inside_an_accepted_run(max_tokens):
    model, params = PrefixModel(), PARAMS["seeded"]
    ref = reference_for(model, params)
    plain = run(model, params, max_tokens=max_tokens)
    assert plain[0][-1].finish_reason == FINISH_LENGTH and len(plain[0]) == max_tokens
    assert_same(plain, run(model, params, max_tokens=max_tokens, speculation=WithDrafter(lambda: Oracle(ref), 5)))


@pytest.mark.parametrize("room", [1, 4, 9])
def test_full_context_inside_an_accepted_run(room):
    model, params = PrefixModel(), PARAMS["greedy"]
    ref = reference_for(model, params)
    n_ctx = len(PROMPT) + room
    plain = run(model, params, max_tokens=60, n_ctx=n_ctx)
    assert plain[0][-1].finish_reason == FINISH_CONTEXT_FULL and plain[1].n_used == n_ctx
    assert_same(plain, run(model, params, max_tokens=60, n_ctx=n_ctx, speculation=WithDrafter(lambda: Oracle(ref), 8)))


@pytest.mark.parametrize("cancel_after", [1, 3, 6])
def test_stop_inside_an_accepted_run(cancel_after):
    model, params = PrefixModel(), PARAMS["seeded"]
    ref = reference_for(model, params)
    plain = run(model, params, max_tokens=60, cancel_after=cancel_after)
    assert plain[0][-1].finish_reason == FINISH_CANCELLED and len(plain[0]) == cancel_after + 1
    assert_same(
        plain,
        run(model, params, max_tokens=60, cancel_after=cancel_after, speculation=WithDrafter(lambda: Oracle(ref), 8)),
    )


def test_rolled_back_cache_equals_a_fresh_runs():
    """A cache that verified wrong drafts and rolled them back holds what plain decoding wrote,
    position by position, and the next answer reuses it as it would a plain cache."""
    model, params = PrefixModel(), PARAMS["greedy"]
    ref = reference_for(model, params)
    plain = run(model, params, max_tokens=30)
    spec = run(model, params, max_tokens=30, speculation=WithDrafter(lambda: Wrong(ref), 6))
    assert_same(plain, spec)
    follow_up = [*plain[1].tokens, 3, 4]
    again = [
        list(generate(model, CharTokenizer(), cache, follow_up, params, max_tokens=10)) for cache in (plain[1], spec[1])
    ]
    assert answer(again[0]) == answer(again[1])
    assert again[1][-1].metrics.prefill_tokens == 2  # every token the cache held was reused


def test_metrics_count_drafts_and_acceptance():
    model, params = PrefixModel(), PARAMS["greedy"]
    ref = reference_for(model, params)
    events, _ = run(model, params, max_tokens=41, speculation=WithDrafter(lambda: Oracle(ref), 4))
    m = events[-1].metrics
    # 41 tokens: the first from the prefill, then 8 rounds of 4 accepted drafts and a bonus.
    assert (m.draft_rounds, m.drafted_tokens, m.accepted_tokens) == (8, 32, 32)
    assert m.acceptance_rate == 1.0 and m.mean_accepted_length == 4.0
    events, _ = run(model, params, max_tokens=21, speculation=WithDrafter(lambda: Wrong(ref), 3))
    m = events[-1].metrics
    # 21 tokens, one per round; drafts shrink where fewer tokens are left to make than 3 + 1:
    # 17 rounds of 3 drafts, then 2, then 1, then a plain step.
    assert (m.draft_rounds, m.drafted_tokens, m.accepted_tokens, m.acceptance_rate) == (19, 54, 0, 0.0)


# -- the adaptive controller --------------------------------------------------------------


def test_expected_gain_by_hand():
    controller = AdaptiveController(VerifyCosts((1.0, 1.5, 2.0), 0.01), longest=2)
    assert controller.acceptance() == [0.5, 0.5]  # no rounds yet: the prior
    assert controller.expected_gain(0) == 1.0
    assert controller.expected_gain(1) == pytest.approx((1 + 0.5) / 1.5)
    assert controller.expected_gain(2) == pytest.approx((1 + 0.5 + 0.25) / 2.0)
    controller.record(2, 1)  # position 0 accepted, position 1 rejected
    # position 0: (1 + 2 * 0.5) / (1 + 2); position 1: (0 + 2 * 2/3) / (1 + 2)
    assert controller.acceptance() == pytest.approx([2 / 3, 4 / 9])
    assert VerifyCosts((1.0, 1.5, 2.0), 0.01)(5) == pytest.approx(3.0)  # extended by the last step, 0.5


def test_controller_drafts_only_where_drafting_is_expected_to_win_by_the_margin():
    # no rounds yet: acceptance 0.5, so one draft yields 1.5 tokens
    narrow = AdaptiveController(VerifyCosts((1.0, 1.45, 1.9), 0.01), longest=2)  # 1.5 / 1.45 = 1.03 tokens per step
    wide = AdaptiveController(VerifyCosts((1.0, 1.40, 1.9), 0.01), longest=2)  # 1.5 / 1.40 = 1.07
    assert (narrow.choose(2), wide.choose(2)) == (0, 1)


def test_a_probe_that_was_right_is_followed_by_another_without_lengthening_the_wait():
    controller = AdaptiveController(VerifyCosts((1.0, 1.45, 1.9), 0.01), longest=2, probe_after=4)
    controller.record(1, 0)  # a draft that failed: plain steps from now on, probes every 4, 8, ...
    assert [controller.choose(2) for _ in range(4)] == [0, 0, 0, 1] and controller.wait == 8
    controller.record(1, 1)  # right, but one success after a failure does not yet say drafting pays
    assert controller.expected_gain(1) < controller.margin
    assert controller.wait == 4 and controller.choose(2) == 1  # the next round probes again


def test_controller_follows_the_rounds_it_times():
    controller = AdaptiveController(VerifyCosts((1.0, 1.2, 1.4), 0.01), longest=2)
    for seconds in (9.0, 0.010, 0.010):  # the first round of a length is left out
        controller.timed(1, seconds)
    assert controller.cost(2) == pytest.approx(1.2)  # no round of 2 timed yet: as measured at load
    for seconds in (9.0, 0.030, 0.030):
        controller.timed(2, seconds)
    assert controller.cost(2) == pytest.approx(3.0)
    controller.timed(2, 0.010)  # a moving average: a fifth of the way to the new time
    assert controller.cost(2) == pytest.approx((0.030 + 0.2 * (0.010 - 0.030)) / 0.010)
    controller.record(2, 2)  # both drafts right, but a round of 2 costs 2.6 steps: not worth it
    assert controller.cost(3) == pytest.approx(1.4) and controller.choose(1) == 0


def passes_with(model, drafter, costs, max_tokens=120):
    """Run `drafter` under an adaptive controller with `costs`; the answer and the model's passes."""
    speculation = WithDrafter(drafter)
    speculation.controller = AdaptiveController(costs, follow_timing=False)  # the mock's own times would not tell
    model.passes.clear()
    events, _ = run(model, PARAMS["greedy"], max_tokens=max_tokens, speculation=speculation)
    return events, model.passes[1:], speculation.controller


def test_controller_falls_back_to_plain_steps_when_drafts_fail():
    model = PrefixModel(eos_bias=-9.0)
    ref = reference_for(model, PARAMS["greedy"], n=130)
    costly = VerifyCosts(tuple(1.0 + 0.7 * t for t in range(9)), 0.01)  # c(T) = 1 + 0.7 (T - 1)
    events, passes, controller = passes_with(model, lambda: Wrong(ref), costly)
    assert [e.token for e in events] == ref[len(PROMPT) : len(PROMPT) + 120]
    checks = [n for n in passes if n > 1]
    # Probes only: after 16 plain rounds, then 32, 64, ... A probe drafts 1 token, the
    # fewest that would pay if drafts were right 90% of the time: (1 + 0.9) / c(2) = 1.9 / 1.7.
    assert checks == [2] * len(checks) and 1 <= len(checks) <= 3 and len(passes) >= 110
    assert controller.choose(8) == 0


def test_controller_never_probes_where_even_good_drafts_would_not_pay():
    model = PrefixModel(eos_bias=-9.0)
    ref = reference_for(model, PARAMS["greedy"], n=130)
    dear = VerifyCosts(tuple(1.0 + 0.95 * t for t in range(9)), 0.01)  # (1 + 0.9) / c(2) < 1, and longer is worse
    events, passes, _ = passes_with(model, lambda: Wrong(ref), dear)
    assert [e.token for e in events] == ref[len(PROMPT) : len(PROMPT) + 120]
    assert passes == [1] * len(passes)


def test_controller_drafts_long_when_drafts_are_right_and_checks_are_cheap():
    model = PrefixModel(eos_bias=-9.0)
    ref = reference_for(model, PARAMS["greedy"], n=130)
    cheap = VerifyCosts(tuple(1.0 + 0.1 * t for t in range(9)), 0.01)
    events, passes, _ = passes_with(model, lambda: Oracle(ref), cheap)
    assert [e.token for e in events] == ref[len(PROMPT) : len(PROMPT) + 120]
    assert passes[0] > 1 and len(passes) <= 120 // 5  # drafting from the start, long runs
    assert sum(n == 9 for n in passes) >= len(passes) - 3


def test_controller_probes_again_and_resumes_when_text_turns_predictable():
    model = PrefixModel(eos_bias=-9.0)
    ref = reference_for(model, PARAMS["greedy"], n=130)
    costs = VerifyCosts(tuple(1.0 + 0.5 * t for t in range(9)), 0.01)

    class WrongThenRight(Oracle):
        def propose(self, history, k):
            draft = super().propose(history, k)
            if len(history) < len(PROMPT) + 40:
                return Draft([(t + 1) % VOCAB for t in draft.tokens])
            return draft

    _, passes, _ = passes_with(model, lambda: WrongThenRight(ref), costs, max_tokens=120)
    assert sum(n > 1 for n in passes[:30]) <= 3  # mostly plain steps while drafts fail
    assert all(n > 1 for n in passes[-6:-1])  # drafting again once they are right
    assert max(passes) == 9  # and as long as the controller allows


def test_a_sampler_that_masks_tokens_decodes_plainly():
    """Constrained output (the server's grammar samplers) needs every step's logits: no drafts."""
    from engine.sampling import Sampler

    class Masking(Sampler):
        masks_tokens = True

    model = PrefixModel()
    ref = reference_for(model, PARAMS["greedy"])
    cache = KVCache(model, 200)
    model.passes.clear()
    events = list(
        generate(
            model,
            CharTokenizer(),
            cache,
            PROMPT,
            PARAMS["greedy"],
            max_tokens=20,
            sampler=Masking(PARAMS["greedy"]),
            speculation=WithDrafter(lambda: Oracle(ref), 4),
        )
    )
    assert [e.token for e in events] == ref[len(PROMPT) : len(PROMPT) + 20]
    assert max(model.passes[1:]) == 1 and events[-1].metrics.drafted_tokens == 0
