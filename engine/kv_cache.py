"""The KV cache: one sequence's per-layer state, allocated once for the whole context,
and the tokens it holds.

The model says what each layer keeps (`Transformer.layer_states`: full attention, a
sliding window's ring, a recurrent state) and the backend allocates it
(`Backend.allocate_state`); this class keeps the bookkeeping that is the same on every
backend: which tokens the state holds, how far it is filled, and rolling back to an
earlier position. The cache owns its length: `feed` runs the forward pass at the next
positions and records the tokens, `append` records tokens whose forward pass the caller
already queued, and `trim` / `truncate` roll back.

A rollback asks the backend to forget the dropped positions (`Backend.forget`), so a cache
that speculated and rolled back holds what a fresh run would. A sliding-window ring can
forget only so many positions (`LayerState.rewind_limit`: RING_SLACK of
`engine.models.attention`), a recurrent state none: past that, the cache starts again and
reads the kept tokens once more, which gives the same state, more slowly. Passes longer
than a ring allows (`pass_tokens`) are fed in pieces.

A model with recurrent layers (Qwen3.5's Gated DeltaNet) has its recurrent arrays copied
(`Backend.snapshot`) before every pass of two or more tokens (a speculative verification, a
prefill chunk), and before a prompt's last token, which a prefill feeds as a pass of its own.
The last SNAPSHOTS of them are kept, with the position each was taken at. A rollback to
position n restores the latest snapshot at or before n (`Backend.restore`; the attention
layers forget positions as usual) and feeds the tokens from there to n again: the accepted
drafts of a verification; nothing when an answer is regenerated (the prompt's end). A
snapshot costs a copy of the recurrent arrays (Qwen3.6-35B-A3B: 30 layers of 2 MB) per
multi-token pass; one-token decode steps take none.
"""

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np

from backends.base import RecurrentState
from engine.errors import ContextFullError

log = logging.getLogger(__name__)
SNAPSHOTS = 4  # recurrent snapshots kept: the latest passes' starts, and the last prompt's end


class KVCache:
    """The state of every layer of `model` for up to `n_ctx` positions."""

    def __init__(self, model: Any, n_ctx: int):
        self.model = model
        self.backend = model.backend
        self.n_ctx = n_ctx
        layers = model.layer_states(n_ctx)
        self.storage: Any = self.backend.allocate_state(layers)
        self.pass_tokens = min((s.pass_tokens for s in layers if s.pass_tokens is not None), default=n_ctx)
        self.rewind_limit = min((s.rewind_limit for s in layers if s.rewind_limit is not None), default=n_ctx)
        self.rereads = 0  # rollbacks past `rewind_limit`, which read the kept tokens again
        self.recurrent = any(isinstance(s, RecurrentState) for s in layers)
        self.snapshots: list[tuple[int, Any]] = []  # (position, the recurrent arrays there), oldest first
        self.restores = 0  # rollbacks that restored a snapshot
        self._tokens: list[int] = []
        self._adapters = self._adapter_version()  # the model's adapters its keys and values were computed under

    def _adapter_version(self) -> int:
        adapters = getattr(self.model, "adapters", None)
        return adapters.version if adapters is not None else 0

    def _check_adapters(self) -> None:
        """Forget everything held when the model's adapters changed since it was computed."""
        version = self._adapter_version()
        if version != self._adapters:
            if self._tokens:
                self.backend.forget(self.storage, 0, len(self._tokens))
            self._tokens = []
            self.snapshots = []
            self._adapters = version

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
        return self.backend.state_bytes(self.storage)

    def feed(self, model: Any, tokens: Sequence[int], all_logits: bool = False) -> np.ndarray:
        """Run `tokens` through `model` at the next positions and hold them, in passes of
        at most `pass_tokens`.

        Returns the host logits: (T, vocab) with `all_logits`, else (1, vocab) for the last.
        """
        self._check_adapters()
        self.check_room(len(tokens))
        pieces = []
        for lo in range(0, len(tokens), self.pass_tokens):
            piece = np.asarray(tokens[lo : lo + self.pass_tokens], dtype=np.int64)
            if self.recurrent and len(piece) > 1 and not all_logits and lo + len(piece) == len(tokens):
                # a prompt's end: its last token alone, after a snapshot, which an answer
                # regenerated (the same prompt fed again from its last token) restores
                self._pass(model, piece[:-1], all_logits)
                piece = piece[-1:]
                self._snapshot()
            pieces.append(self._pass(model, piece, all_logits))
        return pieces[0] if len(pieces) == 1 else np.concatenate(pieces if all_logits else pieces[-1:])

    def _pass(self, model: Any, piece: np.ndarray, all_logits: bool) -> np.ndarray:
        """One forward pass over `piece` at the next positions, held; a recurrent model's
        arrays kept first when it has two or more tokens."""
        if self.recurrent and len(piece) > 1:
            self._snapshot()
        logits = model.forward(piece, self.n_used, self.storage, all_logits)
        self._tokens.extend(int(t) for t in piece)
        return logits

    def _snapshot(self) -> None:
        """Keep the recurrent arrays as they are at the current position (the latest SNAPSHOTS)."""
        kept = [s for s in self.snapshots if s[0] < self.n_used][-(SNAPSHOTS - 1) :]
        self.snapshots = [*kept, (self.n_used, self.backend.snapshot(self.storage))]

    def _restore(self, n: int) -> bool:
        """Roll back to `n` from the latest snapshot at or before it, feeding the tokens from
        there to n again; False where no snapshot is that early."""
        usable = [s for s in self.snapshots if s[0] <= n]
        if not usable:
            return False
        at, arrays = usable[-1]
        self.snapshots = usable
        again = self._tokens[at:n]
        self.backend.forget(self.storage, at, len(self._tokens))  # the attention layers' positions
        self.backend.restore(self.storage, arrays)
        del self._tokens[at:]
        self.restores += 1
        if again:
            self.feed(self.model, again)
        return True

    def append(self, tokens: Sequence[int]) -> None:
        """Record `tokens` at the next positions, whose forward pass the caller has queued."""
        self.check_room(len(tokens))
        self._tokens.extend(int(t) for t in tokens)

    def truncate(self, n: int) -> None:
        """Roll back to the first `n` positions (keeps them, forgets the rest)."""
        if not 0 <= n <= len(self._tokens):
            raise ValueError(f"cannot rewind a cache of {len(self._tokens)} tokens to {n}")
        if n == len(self._tokens):
            return
        if len(self._tokens) - n <= self.rewind_limit:
            self.backend.forget(self.storage, n, len(self._tokens))
            del self._tokens[n:]
            return
        if self.recurrent and self._restore(n):
            return
        kept = self._tokens[:n]  # too far back for a ring or a recurrent state: start again
        log.info(
            "going back %d positions is more than this cache can forget (%d): reading %d tokens again",
            len(self._tokens) - n,
            self.rewind_limit,
            n,
        )
        self.backend.forget(self.storage, 0, len(self._tokens))
        self._tokens = []
        self.snapshots = []
        self.rereads += 1
        if kept:
            self.feed(self.model, kept)

    def reset(self) -> None:
        """Forget every position and start empty (the state as freshly allocated)."""
        self.backend.forget(self.storage, 0, self.n_ctx)
        self._tokens = []
        self.snapshots = []

    def adopt(self, tokens: Sequence[int]) -> None:
        """Hold `tokens`, whose state the caller has just written into the storage (a saved
        state restored), computed under the model's adapters as they are now."""
        if len(tokens) > self.n_ctx:
            raise ValueError(f"{len(tokens)} tokens do not fit a cache of {self.n_ctx}")
        self._tokens = [int(t) for t in tokens]
        self.snapshots = []  # taken of the state the restored one replaced
        self._adapters = self._adapter_version()

    def trim(self, n: int) -> int:
        """Forget the last `n` positions (at most all of them); return how many were forgotten."""
        n = min(max(n, 0), len(self._tokens))
        self.truncate(len(self._tokens) - n)
        return n

    def common_prefix(self, tokens: Sequence[int]) -> int:
        """How many leading `tokens` the cache already holds (none after the model's adapters changed)."""
        self._check_adapters()
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
