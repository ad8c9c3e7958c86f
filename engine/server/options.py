"""The sampling options of a request that need every step's logits: `logit_bias` and
`logprobs` (with `top_logprobs`).

`OptionSampler` wraps the request's sampler (plain or grammar-guided). At each step it adds
the biases to the model's logits (a bias of -100 bans the token outright: its logit becomes
-inf), records the log-probabilities, then lets the wrapped sampler apply its penalties,
masks and temperature and draw. The log-probabilities are the log-softmax of the model's
logits after `logit_bias` and before anything else: repetition penalties, grammar masks,
top-k/top-p/min-p and temperature do not change them. That is the model's own distribution
(as OpenAI reports it, whatever the temperature), and it is what a client can recompute
from the model.
"""

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from engine.sampling import Sampler, largest_first
from engine.tokenizer import Tokenizer

BAN = -100.0  # the bias that forbids a token
LOGPROB_FLOOR = -9999.0  # stands for -inf (a banned or masked token) in JSON, as OpenAI does


@dataclass(frozen=True)
class TokenLogprob:
    """One sampled token's log-probability, and the `top` most likely tokens of its step."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...]


class OptionSampler(Sampler):
    """A sampler that applies `logit_bias` and records log-probabilities, around another."""

    masks_tokens = True  # it needs every step's logits on the host (no device argmax, no drafts)

    def __init__(self, inner: Sampler, bias: dict[int, float], top_logprobs: int | None):
        super().__init__(inner.params)
        self.inner = inner
        self.rng = inner.rng
        self.bias_ids = np.fromiter(bias, dtype=np.int64, count=len(bias))
        self.bias_values = np.array([float("-inf") if v <= BAN else v for v in bias.values()], dtype=np.float32)
        self.top_logprobs = top_logprobs  # None: no log-probabilities
        self.records: list[TokenLogprob] = []  # one per sampled token, in order

    def biased(self, logits: np.ndarray) -> np.ndarray:
        """A copy of `logits` (vocab,) with the biases added."""
        out = np.array(logits, dtype=np.float32)
        if self.bias_ids.size:
            out[self.bias_ids] += self.bias_values
        return out

    def sample(self, logits: np.ndarray, history: Sequence[int] = ()) -> int:
        logits = self.biased(logits)
        token = self.inner.sample(logits, history)
        if self.top_logprobs is not None:
            logprobs = log_softmax(logits)
            top = largest_first(logprobs, self.top_logprobs) if self.top_logprobs else np.zeros(0, np.int64)
            self.records.append(
                TokenLogprob(token, _finite(logprobs[token]), tuple((int(i), _finite(logprobs[i])) for i in top))
            )
        return token


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """log softmax of float32 logits (vocab,), computed in float64."""
    x = np.asarray(logits, dtype=np.float64)
    top = x.max()
    return x - (top + np.log(np.exp(x - top).sum()))


def _finite(value: float) -> float:
    return max(float(value), LOGPROB_FLOOR)


def _piece(tokenizer: Tokenizer, token: int) -> tuple[str, list[int]]:
    raw = tokenizer.token_bytes(token, special=True)
    return raw.decode("utf-8", errors="replace"), list(raw)


def chat_logprobs(tokenizer: Tokenizer, records: Sequence[TokenLogprob]) -> dict:
    """OpenAI's chat `logprobs` object: {"content": [{token, logprob, bytes, top_logprobs}]}."""
    content = []
    for record in records:
        text, raw = _piece(tokenizer, record.token)
        top = []
        for token, logprob in record.top:
            top_text, top_raw = _piece(tokenizer, token)
            top.append({"token": top_text, "logprob": logprob, "bytes": top_raw})
        content.append({"token": text, "logprob": record.logprob, "bytes": raw, "top_logprobs": top})
    return {"content": content}


def completion_logprobs(tokenizer: Tokenizer, records: Sequence[TokenLogprob], offset: int = 0) -> dict:
    """OpenAI's (legacy) completions `logprobs` object: tokens, token_logprobs, top_logprobs
    (a mapping per token) and text_offset (from `offset`, in characters of the answer)."""
    tokens, logprobs, tops, offsets = [], [], [], []
    for record in records:
        text, _ = _piece(tokenizer, record.token)
        tokens.append(text)
        logprobs.append(record.logprob)
        tops.append({_piece(tokenizer, t)[0]: lp for t, lp in record.top})
        offsets.append(offset)
        offset += len(text)
    return {"tokens": tokens, "token_logprobs": logprobs, "top_logprobs": tops, "text_offset": offsets}
