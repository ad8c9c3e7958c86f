"""Speculative decoding for models with recurrent layers: a rejected draft is undone by restoring a
snapshot of the recurrent state and reading the accepted tokens again, and the adaptive
controller counts that in each draft length's cost (values worked out by hand below); where
even drafts that are right 90% of the time would not pay with it, drafting is turned off for
the model and the reason is given (the CLI's note; the app shows the same text as a notice).

The costs are given, not timed: `measure_costs` is replaced where a decision is tested, and
only whether it measured a rollback at all is checked on a real hybrid model."""

import json

import pytest

from engine import cli, speculation
from engine.kv_cache import KVCache
from engine.speculation import AdaptiveController, Speculation, VerifyCosts, measure_costs
from tests.engine.prefix_model import PrefixModel
from tests.engine.test_moe_against_transformers import load
from tests.engine.test_speculative import PARAMS, run
from tests.gguf_factory import write_tiny_model

DEAR = (1.0, 1.8)  # c(1), c(2): a check of 2 tokens costs 1.8 steps (c(T) then grows by 0.8 a token)


def test_the_rollback_is_counted_in_each_lengths_cost_by_hand():
    plain = AdaptiveController(VerifyCosts((1.0, 1.3, 1.6), 0.01), longest=2)
    hybrid = AdaptiveController(VerifyCosts((1.0, 1.3, 1.6), 0.01, restore=0.1), longest=2)
    # no rounds yet: each draft accepted with chance 0.5
    assert plain.expected_gain(1) == pytest.approx(1.5 / 1.3)
    # one draft: rejected half the time, then restore (0.1) and read the last token again (c(1) = 1)
    assert hybrid.expected_gain(1) == pytest.approx(1.5 / (1.3 + 0.5 * (0.1 + 1.0)))
    # two drafts: none kept (0.5): 0.1 + c(1); only the first kept (0.25): 0.1 + c(2)
    assert hybrid.expected_gain(2) == pytest.approx(1.75 / (1.6 + 0.5 * 1.1 + 0.25 * (0.1 + 1.3)))
    assert hybrid.expected_gain(0) == plain.expected_gain(0) == 1.0


def prepared(monkeypatch, costs: VerifyCosts) -> Speculation:
    """An "auto" Speculation prepared with the given costs in place of measured ones."""
    monkeypatch.setattr(speculation, "measure_costs", lambda model, cache: costs)
    monkeypatch.setattr(speculation, "scratch_cache", lambda model: None)
    made = Speculation("auto")
    made.prepare(PrefixModel())
    return made


def test_drafting_is_turned_off_where_the_rollback_tips_the_balance(monkeypatch):
    # Without a recurrent state, one draft right 90% of the time pays: 1.9 tokens for 1.8 steps
    # (1.056, above the 1.05 margin). With a restore of 0.05 steps, a rejection (10%) also costs
    # 0.05 + c(1): 1.9 / (1.8 + 0.1 * 1.05) = 0.997, and longer drafts do worse.
    attention_only = prepared(monkeypatch, VerifyCosts(DEAR, 0.01))
    assert attention_only.enabled and attention_only.off_because is None
    hybrid = prepared(monkeypatch, VerifyCosts(DEAR, 0.01, restore=0.05))
    assert not hybrid.enabled
    assert "recurrent state (0.05 steps)" in hybrid.off_because and "costs 1.80 steps" in hybrid.off_because
    assert hybrid.mode == "auto"  # the user's choice is kept; the model's costs turned it off


def test_a_hybrid_model_whose_rollbacks_are_cheap_keeps_drafting(monkeypatch):
    hybrid = prepared(monkeypatch, VerifyCosts((1.0, 1.2), 0.01, restore=0.05))  # 1.9 / (1.2 + 0.105) = 1.46
    assert hybrid.enabled and hybrid.off_because is None


def test_an_answer_with_drafting_turned_off_decodes_plainly(monkeypatch):
    hybrid = prepared(monkeypatch, VerifyCosts(DEAR, 0.01, restore=0.05))
    model = PrefixModel()
    events, _ = run(model, PARAMS["greedy"], max_tokens=40, speculation=hybrid)
    plain, _ = run(PrefixModel(), PARAMS["greedy"], max_tokens=40)
    assert [e.token for e in events] == [e.token for e in plain]
    assert events[-1].metrics.draft_rounds == 0
    assert all(n == 1 for n in model.passes[1:])  # one token a pass after the prompt


def test_the_cli_says_why_drafting_is_off(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(speculation, "measure_costs", lambda model, cache: VerifyCosts(DEAR, 0.01, restore=0.05))
    model = write_tiny_model(tmp_path / "tiny.gguf")
    argv = ["generate", "--model", str(model), "--backend", "numpy", "--tokens", "1,2", "--max-tokens", "2", "--json"]
    assert cli.main(argv) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["tokens"]  # it answered, plainly
    assert "note: tiny-qwen3: speculative decoding is off for this model" in err


def test_a_rollback_is_measured_for_a_hybrid_model_and_not_for_others():
    loaded = load("tiny-qwen35", "f32", "numpy")
    try:
        costs = measure_costs(loaded.model, KVCache(loaded.model, 32), longest=3, rounds=1)
        assert costs.restore is not None and costs.restore >= 0.0
    finally:
        loaded.close()
    model = PrefixModel()
    assert measure_costs(model, KVCache(model, 32), longest=3, rounds=1).restore is None
