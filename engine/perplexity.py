"""Perplexity over a text, following llama.cpp's `llama-perplexity` protocol.

- Tokenize the whole text without BOS.
- Cut windows of `ctx` tokens starting at 0, ctx, 2*ctx, ... while start + ctx < length.
- If the model adds a BOS, it replaces each window's first token.
- Score the prediction of every token in each window's second half: the logits at
  positions ctx/2 .. ctx-2 predicting tokens ctx/2+1 .. ctx-1, as llama.cpp does.

A window goes through the model at once (a prefill), or, with `chunk`, in pieces of that many
tokens, as decoding and speculative verification feed it: on the cpu backend, products over
fewer than 32 tokens quantize the activations, a prefill's do not.
"""

from dataclasses import dataclass

import numpy as np

from engine.loader import LoadedModel


@dataclass(frozen=True)
class PerplexityResult:
    """The perplexity and the number of token predictions it averages over."""

    ppl: float
    tokens_scored: int


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise log-softmax in float64, for (n, vocab) logits."""
    shifted = logits.astype(np.float64) - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def perplexity(
    loaded: LoadedModel, text: str, ctx: int = 256, max_windows: int | None = None, chunk: int | None = None
) -> PerplexityResult:
    """Perplexity of `text` in windows of `ctx` tokens, each fed whole or `chunk` tokens at a time
    (see the module docstring)."""
    tokens = loaded.tokenizer.encode(text, add_bos=False)
    starts = [s for s in range(0, len(tokens), ctx) if s + ctx < len(tokens)]
    if max_windows is not None:
        starts = starts[:max_windows]
    if not starts:
        raise ValueError(f"the text has {len(tokens)} tokens; perplexity needs more than ctx={ctx}")
    cache = loaded.new_cache(ctx)
    total_nll, scored = 0.0, 0
    for start in starts:
        window = list(tokens[start : start + ctx])
        bos = loaded.tokenizer.bos_id
        if loaded.tokenizer.add_bos and bos is not None:
            window[0] = bos
        cache.truncate(0)
        step = chunk or ctx
        logits = np.concatenate(
            [
                loaded.model.forward(
                    np.asarray(window[at : at + step], dtype=np.int64), at, cache.storage, all_logits=True
                )
                for at in range(0, ctx, step)
            ]
        )  # (ctx, vocab)
        first = ctx // 2
        logprobs = log_softmax(logits[first : ctx - 1])  # (ctx - 1 - first, vocab)
        targets = np.asarray(window[first + 1 :], dtype=np.int64)
        total_nll -= float(logprobs[np.arange(len(targets)), targets].sum())
        scored += len(targets)
    return PerplexityResult(float(np.exp(total_nll / scored)), scored)
