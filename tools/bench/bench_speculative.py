"""Speculative against plain decoding, end to end, interleaved in one process.

For each workload the same answer is produced with --speculative off, auto and ngram (a
fixed draft length), and with plain decoding a second time (the control: what the
machine's noise alone makes of two identical runs), one after the other, `--rounds`
times, the order rotating each round; tokens/s counts every decode second, the drafter's
included. A mode's figure against plain decoding is the median over rounds of its tokens/s
over plain decoding's in the same round (paired, so a slow stretch of the machine hits
both); the control's median and range say how far noise alone moves that figure. Prints
a Markdown table (docs/benchmarks.md) and, with --json, the raw figures. Chat turn 2 is
the second answer of a two-turn session (the first turn's answer is in its prompt).

    .venv/bin/python -m tools.bench.bench_speculative --model smollm2 --backend cpu --tokens 128 --rounds 8
"""

import argparse
import json
import os
import statistics
import time

from engine.bundled import resolve_model_path
from engine.chat_session import ChatSession
from engine.loader import load_model
from engine.sampling import SamplingParams
from engine.speculation import Speculation, measure_costs

ARTICLE = (
    "The city council met on Tuesday to discuss the new bicycle lanes on Main Street. Supporters said the lanes "
    "would make cycling safer and reduce traffic. Shop owners worried that removing parking spaces would hurt "
    "their business. After two hours of debate, the council voted five to two to build the lanes next spring, "
    "and promised to add a parking garage near the market square by the end of the year."
)
CODE = (
    "def total_price(items):\n    total = 0\n    for item in items:\n"
    "        total = total + item.price * item.quantity\n    return total\n"
)
WORKLOADS = {
    "summarization": [f"{ARTICLE}\n\nSummarize the text above in two sentences."],
    "code editing": [
        (f"{CODE}\nRename the function to order_total and the variable total to amount. Show the whole code.")
    ],
    "document Q&A": [
        (
            f"{ARTICLE}\n\nAccording to the text, when will the lanes be built, and what did the "
            "council promise? Quote the text."
        )
    ],
    "chat turn 1": ["What are three tips for learning a new language?"],
    "chat turn 2": ["What are three tips for learning a new language?", "Repeat your second tip and explain it."],
    "creative writing": ["Write a short poem about a lighthouse in a storm."],
}
SAMPLING = {
    "greedy": SamplingParams.greedy(),
    "app default": SamplingParams(temperature=0.7, top_k=40, top_p=0.95, min_p=0.05, repeat_penalty=1.1, seed=1),
}
MODES = {
    "off": lambda: Speculation("off"),
    "auto": lambda: Speculation("auto"),
    "ngram k=4": lambda: Speculation("ngram", 4),
    "off again": lambda: Speculation("off"),  # the control
}


def run_turns(loaded, turns, params, speculation, max_tokens):
    """The last turn's final metrics (earlier turns are answered the same way, untimed)."""
    session = ChatSession(loaded, params=params, max_tokens=max_tokens, speculation=speculation)
    for text in turns:
        *_, last = session.send(text)
    return last.metrics


def drafted_accepted(metrics) -> tuple[int, int, int]:
    """Draft tokens checked, accepted, and checking passes, over the runs of one mode."""
    return (
        sum(m.drafted_tokens for m in metrics),
        sum(m.accepted_tokens for m in metrics),
        sum(m.draft_rounds for m in metrics),
    )


def rate(metrics) -> float:
    """Decode tokens per second of one answer."""
    return metrics.decode_tokens / metrics.decode_seconds


def paired(figures: dict, mode: str) -> list[float]:
    """`mode`'s tokens/s over plain decoding's, round by round."""
    return [rate(m) / rate(plain) for m, plain in zip(figures[mode], figures["off"], strict=True)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--backend", default="cpu")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    loaded = load_model(resolve_model_path(args.model), args.backend)
    # c(T), measured on a cache of the answers' shape, so the passes it records serve them
    costs = measure_costs(loaded.model, loaded.new_cache())
    rows = []
    load_before = os.getloadavg()
    modes = list(MODES)
    for workload, turns in WORKLOADS.items():
        for sampling, params in SAMPLING.items():
            figures = {mode: [] for mode in MODES}
            for round_ in range(args.rounds):
                for mode in modes[round_ % len(modes) :] + modes[: round_ % len(modes)]:  # the order rotates
                    speculation = MODES[mode]()
                    if speculation.enabled:
                        speculation.prepare(loaded.model)  # at load in the app: not part of the answer
                    figures[mode].append(run_turns(loaded, turns, params, speculation, args.tokens))
            rows.append((workload, sampling, figures))
    load_after = os.getloadavg()
    report = {
        "model": loaded.path.name,
        "backend": loaded.backend.name,
        "device": loaded.backend.device_name,
        "c(T)": [round(c, 2) for c in costs.ratios],
        "step_ms": costs.step_seconds * 1000,
        "rounds": args.rounds,
        "tokens": args.tokens,
        "loadavg_before": load_before,
        "loadavg_after": load_after,
        "time": time.strftime("%Y-%m-%d %H:%M"),
        "rows": [],
    }
    print(
        f"{report['model']} on {report['device']}; c(1..9) = {report['c(T)']}; {args.rounds} rounds of "
        f"{args.tokens} tokens; load average {load_before[0]:.1f} before, {load_after[0]:.1f} after"
    )
    print(
        "| workload | sampling | plain tok/s | auto / plain | control: plain / plain (range) | auto: drafted, accepted "
        "| ngram k=4 / plain | ngram: acceptance | ngram: accepted per check |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for workload, sampling, figures in rows:
        ratio = {mode: paired(figures, mode) for mode in ("auto", "ngram k=4", "off again")}
        drafts = {mode: drafted_accepted(ms) for mode, ms in figures.items()}
        drafted, accepted, checks = drafts["ngram k=4"]
        acceptance = f"{accepted / drafted:.0%}" if drafted else "—"
        per_check = f"{accepted / checks:.2f}" if checks else "—"
        auto_drafted, auto_accepted, _ = drafts["auto"]
        control = ratio["off again"]
        print(
            f"| {workload} | {sampling} | {statistics.median(rate(m) for m in figures['off']):.1f} "
            f"| {statistics.median(ratio['auto']):.2f} "
            f"| {statistics.median(control):.2f} ({min(control):.2f}-{max(control):.2f}) "
            f"| {auto_drafted}, {auto_accepted} | {statistics.median(ratio['ngram k=4']):.2f} "
            f"| {acceptance} | {per_check} |"
        )
        report["rows"].append(
            {
                "workload": workload,
                "sampling": sampling,
                "tok_s": {mode: [rate(m) for m in ms] for mode, ms in figures.items()},
                "drafted_accepted_checks": drafts,
            }
        )
    if args.json:
        print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
