"""The one-line figures of an answer and their tooltip, against hand-written text."""

from app.metrics_text import metrics_summary, metrics_tooltip


def test_metrics_with_missing_figures_leave_them_out():
    partial = {"decode_tokens": 3, "decode_tok_s": None, "time_to_first_token_s": 1.5, "prefill_tok_s": None}
    assert metrics_summary(partial, "m") == "3 tokens · TTFT 1.50 s · m"
    assert metrics_summary({"error": "boom"}, "m") == ""
    assert metrics_tooltip({"context_used": 5, "context_size": None}) == ""


def test_extra_items_follow_the_figures_and_empty_ones_are_skipped():
    metrics = {"decode_tokens": 12, "decode_tok_s": 30.04, "time_to_first_token_s": 0.151}
    assert metrics_summary(metrics, None, "cancelled") == "12 tokens · 30.0 tok/s · TTFT 0.15 s · cancelled"
    assert metrics_summary(metrics) == "12 tokens · 30.0 tok/s · TTFT 0.15 s"
    assert metrics_summary(None, "m") == ""


def test_figures_that_are_not_numbers_are_left_out():
    # Metrics can come from an imported file that anyone can write.
    odd = {"decode_tokens": "many", "decode_tok_s": True, "time_to_first_token_s": 0.5, "prefill_tokens": [1]}
    assert metrics_summary(odd, "m") == "TTFT 0.50 s · m"
    assert metrics_tooltip(odd) == "Time to first token: 0.500 s"
    assert metrics_tooltip({"context_used": "5", "context_size": 2048}) == ""


def test_tooltip_lists_every_figure_with_latency_in_milliseconds():
    metrics = {
        "prefill_tokens": 40,
        "prefill_tok_s": 812.34,
        "time_to_first_token_s": 0.0492,
        "decode_tokens": 128,
        "decode_tok_s": 31.234,
        "last_token_latency_s": 0.0321,
        "context_used": 1508,
        "context_size": 2048,
    }
    assert metrics_tooltip(metrics).splitlines() == [
        "Prompt tokens processed: 40",
        "Prefill speed: 812.3 tok/s",
        "Time to first token: 0.049 s",
        "Tokens generated: 128",
        "Generation speed: 31.23 tok/s",
        "Last token latency: 32.1 ms",
        "Context: 1,508 of 2,048 tokens",
    ]


def test_speculative_figures_show_acceptance():
    drafted = {"decode_tokens": 3, "acceptance_rate": 0.5, "mean_accepted_length": 1.25}
    assert metrics_summary(drafted) == "3 tokens · drafts 50% accepted"
    assert metrics_tooltip(drafted) == "Tokens generated: 3\nDrafts accepted: 50%\nAccepted per check: 1.25 tokens"
