"""An answer's figures as text, Qt-free: the line under a message card, its tooltip, and the
footnote of an exported chat.

Metrics may come from an imported file, so a figure that is not a number is left out
rather than failing to format.
"""

SUMMARY_FIGURES = (
    ("decode_tokens", "{:.0f} tokens"),
    ("decode_tok_s", "{:.1f} tok/s"),
    ("time_to_first_token_s", "TTFT {:.2f} s"),
    ("prefill_tok_s", "prefill {:.0f} tok/s"),
    ("acceptance_rate", "drafts {:.0%} accepted"),
)
TOOLTIP_FIGURES = (
    ("prefill_tokens", "Prompt tokens processed: {:.0f}"),
    ("prefill_tok_s", "Prefill speed: {:.1f} tok/s"),
    ("time_to_first_token_s", "Time to first token: {:.3f} s"),
    ("decode_tokens", "Tokens generated: {:.0f}"),
    ("decode_tok_s", "Generation speed: {:.2f} tok/s"),
    ("last_token_latency_s", "Last token latency: {:.1f} ms"),
    ("acceptance_rate", "Drafts accepted: {:.0%}"),
    ("mean_accepted_length", "Accepted per check: {:.2f} tokens"),
)
SCALE = {"last_token_latency_s": 1000.0}  # shown in ms


def _number(metrics: dict, key: str) -> float | None:
    value = metrics.get(key)
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _figures(metrics: dict | None, templates: tuple[tuple[str, str], ...]) -> list[str]:
    """Each template filled with its figure, for the figures `metrics` has."""
    metrics = metrics or {}
    values = [(_number(metrics, key), key, template) for key, template in templates]
    return [template.format(value * SCALE.get(key, 1)) for value, key, template in values if value is not None]


def metrics_summary(metrics: dict | None, *extra: str | None) -> str:
    """The one-line figures of an answer: '128 tokens · 31.2 tok/s · TTFT 0.42 s · …'.

    `extra` items (the model's name, an export's message state) follow the figures; empty
    ones are skipped. Empty when there are no figures (an answer that failed before its
    first token).
    """
    parts = _figures(metrics, SUMMARY_FIGURES)
    return " · ".join(parts + [item for item in extra if item]) if parts else ""


def metrics_tooltip(metrics: dict | None) -> str:
    """Every figure of an answer, one per line, for the details line's tooltip."""
    lines = _figures(metrics, TOOLTIP_FIGURES)
    used, size = _number(metrics or {}, "context_used"), _number(metrics or {}, "context_size")
    if used is not None and size:
        lines.append(f"Context: {used:,.0f} of {size:,.0f} tokens")
    return "\n".join(lines)
