"""Batched decoding: the decode steps of several sequences run as one forward pass.

Plain decoding (`engine.decoding.DecodeSteps`) asks `batched_step` for its step function.
Outside a batch, or on a backend that cannot batch, it gets None and steps its sequence
alone. On a thread that runs inside `stepping(post)` (the server's scheduler runs each
generation on such a thread), each step instead becomes a `StepRequest` handed to `post`,
which returns once the step has run: the scheduler gathers the requests of every running
generation and runs them with `run_batch`, one `Transformer.decode_batch` per model. Each
sequence keeps its own KV storage and position; sampling stays with each generation, on
the host.
"""

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.models.common import Transformer


@dataclass
class StepRequest:
    """One sequence's decode step, waiting for its batch: feed `token` at `position`."""

    model: Transformer
    storage: Any
    token: int
    position: int
    logits: Any = None  # backend logits (1, vocab), once the batch ran
    error: BaseException | None = None  # what ended the batch instead


Post = Callable[[StepRequest], Any]
"""Hands a step to the batcher; returns its logits (1, vocab) once the batch ran, or raises its error."""

_post: ContextVar[Post | None] = ContextVar("sprig_batch_post", default=None)


@contextmanager
def stepping(post: Post) -> Iterator[None]:
    """Within this block, on this thread, plain decode steps go to `post`."""
    reset = _post.set(post)
    try:
        yield
    finally:
        _post.reset(reset)


def batched_step(model: Transformer, storage: Any) -> Callable[[int, int], Any] | None:
    """The step function (token, position) -> logits (1, vocab) that goes through the batch
    this thread decodes in; None outside `stepping`, or on a backend without
    `batched_decode` (MLX), where the sequence keeps its own step (and its greedy tokens on
    the device) and takes its turns between the batched passes."""
    post = _post.get()
    if post is None or not model.backend.batched_decode:
        return None
    return lambda token, position: post(StepRequest(model, storage, int(token), int(position)))


def run_batch(requests: list[StepRequest]) -> None:
    """Run every request's step, one forward pass per model, and fill in its logits or error.

    A model's requests fewer than its backend's `min_decode_batch` run their own steps.
    """
    by_model: dict[int, list[StepRequest]] = {}
    for request in requests:
        by_model.setdefault(id(request.model), []).append(request)
    for group in by_model.values():
        model = group[0].model
        try:
            if len(group) < model.backend.min_decode_batch:
                for request in group:
                    request.logits = model.decode_step(request.storage)(request.token, request.position)
                continue
            tokens = np.array([r.token for r in group], dtype=np.int64)  # (B,)
            positions = np.array([r.position for r in group], dtype=np.int64)  # (B,)
            logits = model.decode_batch(tokens, positions, [r.storage for r in group])  # (B, vocab)
            for b, request in enumerate(group):
                request.logits = logits[b : b + 1]  # (1, vocab)
        except Exception as exc:  # the generations that asked hear of it, each on its own thread
            for request in group:
                request.error = exc
