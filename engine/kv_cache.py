"""The KV cache: storage allocated once for the whole context, and the tokens it holds.

The backend owns the storage (`Backend.allocate_kv`); this class keeps the bookkeeping
that is the same on every backend: which tokens the cache holds, how far it is filled,
and rolling back to an earlier position. The cache owns its length: `feed` runs the
forward pass at the next positions and records the tokens, `append` records tokens whose
forward pass the caller already queued, and `trim` / `truncate` roll back. A rollback asks
the backend to forget the dropped positions (`Backend.forget_kv`), so a cache that
speculated and rolled back holds what a fresh run would.

Sliding-window layers keep full-length storage and attend only to their window. That
spends memory on positions a local layer will never read again, but keeps every rewind
exact: a ring buffer would already have overwritten what a rewind needs.
"""

from collections.abc import Sequence
from typing import Any

import numpy as np

from backends.base import Backend
from engine.config import ModelConfig
from engine.errors import ContextFullError


class KVCache:
    """Keys and values of every layer for up to `n_ctx` positions."""

    def __init__(self, backend: Backend, config: ModelConfig, n_ctx: int):
        self.backend = backend
        self.n_ctx = n_ctx
        self.storage: Any = backend.allocate_kv(
            config.n_layers, n_ctx, config.n_kv_heads, config.head_dim, config.value_head_dim
        )
        self._tokens: list[int] = []

    @property
    def tokens(self) -> tuple[int, ...]:
        """The tokens held, one per filled position."""
        return tuple(self._tokens)

    @property
    def n_used(self) -> int:
        """Positions filled so far."""
        return len(self._tokens)

    @property
    def n_free(self) -> int:
        """Positions still free."""
        return self.n_ctx - len(self._tokens)

    def memory_bytes(self) -> int:
        """Bytes the storage occupies."""
        return self.backend.kv_bytes(self.storage)

    def feed(self, model: Any, tokens: Sequence[int], all_logits: bool = False) -> np.ndarray:
        """Run `tokens` through `model` at the next positions and hold them.

        Returns the host logits: (T, vocab) with `all_logits`, else (1, vocab) for the last.
        """
        self.check_room(len(tokens))
        logits = model.forward(np.asarray(tokens, dtype=np.int64), self.n_used, self.storage, all_logits)
        self._tokens.extend(int(t) for t in tokens)
        return logits

    def append(self, tokens: Sequence[int]) -> None:
        """Record `tokens` at the next positions, whose forward pass the caller has queued."""
        self.check_room(len(tokens))
        self._tokens.extend(int(t) for t in tokens)

    def truncate(self, n: int) -> None:
        """Roll back to the first `n` positions (keeps them, forgets the rest)."""
        if not 0 <= n <= len(self._tokens):
            raise ValueError(f"cannot rewind a cache of {len(self._tokens)} tokens to {n}")
        if n < len(self._tokens):
            self.backend.forget_kv(self.storage, n, len(self._tokens))
            del self._tokens[n:]

    def trim(self, n: int) -> int:
        """Forget the last `n` positions (at most all of them); return how many were forgotten."""
        n = min(max(n, 0), len(self._tokens))
        self.truncate(len(self._tokens) - n)
        return n

    def common_prefix(self, tokens: Sequence[int]) -> int:
        """How many leading `tokens` the cache already holds."""
        n = 0
        for held, new in zip(self._tokens, tokens, strict=False):
            if held != new:
                break
            n += 1
        return n

    def check_room(self, n_new: int) -> None:
        """Raise ContextFullError unless `n_new` more tokens fit."""
        if n_new > self.n_free:
            raise ContextFullError(
                f"The context is full: {self.n_used} of {self.n_ctx} tokens are used and "
                f"{n_new} more do not fit. Start a new conversation or raise the context length."
            )
