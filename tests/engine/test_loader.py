"""Loading a model: progress reporting and cancellation."""

import threading

import pytest

from engine.bundled import bundled_model
from engine.errors import LoadCancelled
from engine.loader import load_model


def test_progress_rises_to_one_through_named_stages():
    seen: list[tuple[float, str]] = []
    loaded = load_model(bundled_model("smollm2").path, "numpy", progress=lambda f, stage: seen.append((f, stage)))
    loaded.close()
    fractions = [f for f, _ in seen]
    assert fractions == sorted(fractions)
    assert fractions[0] == 0.0 and fractions[-1] == 1.0
    # one report per prepared weight, so the bar moves in small steps
    assert len(seen) > loaded.config.n_layers * 9
    assert {"Reading the model file", "Building the tokenizer", "Preparing the weights"} <= {s for _, s in seen}


def test_cancel_stops_loading_between_steps():
    cancel = threading.Event()
    after_cancel: list[float] = []

    def progress(fraction: float, stage: str) -> None:
        if cancel.is_set():
            after_cancel.append(fraction)
        if fraction > 0.5:
            cancel.set()

    with pytest.raises(LoadCancelled, match="cancelled"):
        load_model(bundled_model("smollm2").path, "numpy", progress=progress, cancel=cancel)
    assert after_cancel == []
