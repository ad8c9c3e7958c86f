"""The KV cache: storage allocated once for the whole context, and the tokens it holds.

The backend owns the storage (`Backend.allocate_kv`); this class keeps the bookkeeping
that is the same on every backend: which tokens the cache holds, how far it is filled,
and rewinding to an earlier position. Rewinding is free: positions past the new end are
simply overwritten by the next forward pass.

Sliding-window layers keep full-length storage and attend only to their window. That
spends memory on positions a local layer will never read again, but keeps every rewind
exact: a ring buffer would already have overwritten what a rewind needs.
"""

from typing import Any

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
        self.tokens: list[int] = []

    @property
    def n_used(self) -> int:
        """Positions filled so far."""
        return len(self.tokens)

    @property
    def n_free(self) -> int:
        """Positions still free."""
        return self.n_ctx - len(self.tokens)

    def memory_bytes(self) -> int:
        """Bytes the storage occupies."""
        return self.backend.kv_bytes(self.storage)

    def truncate(self, n: int) -> None:
        """Rewind to the first `n` positions (keeps them, forgets the rest)."""
        if not 0 <= n <= len(self.tokens):
            raise ValueError(f"cannot rewind a cache of {len(self.tokens)} tokens to {n}")
        del self.tokens[n:]

    def common_prefix(self, tokens: list[int]) -> int:
        """How many leading `tokens` the cache already holds."""
        n = 0
        for held, new in zip(self.tokens, tokens, strict=False):  # the shorter one ends it
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
