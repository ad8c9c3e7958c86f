"""A stand-in model whose logits are an exact function of the token prefix.

`PrefixModel` follows the `Transformer` interface the engine uses (`forward`,
`decode_step`, `backend`, `config`). Its "KV cache" stores the token at each position;
the logits after position i are drawn from a generator seeded by a hash of every stored
token up to i, so a stale or missing position changes them, and a rollback that leaves the
storage different from a fresh run's shows up. Batched and one-by-one passes give the same
numbers exactly. `CharTokenizer` writes token i as one letter; token 0 is end-of-text.
"""

import zlib
from types import SimpleNamespace

import numpy as np

from backends.base import AttentionState

VOCAB = 24
EOS = 0


class PrefixKV:
    """Storage of the tokens at each position; -1 where nothing was written."""

    def __init__(self, n_ctx: int):
        self.tokens = np.full(n_ctx, -1, dtype=np.int64)


class PrefixBackend:
    """The backend hooks the engine calls on a model's backend."""

    name = "prefix"
    device_tokens = False

    def allocate_state(self, layers: list) -> PrefixKV:
        return PrefixKV(layers[0].slots)

    def state_bytes(self, state: PrefixKV) -> int:
        return state.tokens.nbytes

    def forget(self, state: PrefixKV, start: int, end: int) -> None:
        state.tokens[start:end] = -1

    def to_host(self, x: np.ndarray) -> np.ndarray:
        return np.asarray(x, dtype=np.float32)


class PrefixModel:
    """Logits (vocab,) after a prefix: normal draws, times `spread`, seeded by the prefix's hash.

    `eos_bias` is added to the end-of-text logit (negative: answers run long).
    """

    def __init__(self, vocab: int = VOCAB, spread: float = 2.0, eos_bias: float = -4.0):
        self.vocab, self.spread, self.eos_bias = vocab, spread, eos_bias
        self.backend = PrefixBackend()
        self.config = SimpleNamespace(n_layers=1, n_kv_heads=1, head_dim=1, value_head_dim=1, vocab_size=vocab)
        self.passes: list[int] = []  # tokens per forward pass, in order
        self._known: dict[bytes, np.ndarray] = {}

    def layer_states(self, n_ctx: int) -> list:
        """One layer holding a token per position of the context."""
        return [AttentionState(1, 1, 1, n_ctx)]

    def logits_after(self, prefix: np.ndarray) -> np.ndarray:
        """The logits that follow `prefix` (int64 tokens), (vocab,) float32."""
        key = np.ascontiguousarray(prefix, dtype=np.int64).tobytes()
        if key not in self._known:  # drawing is slow; the chi-square test asks for the same prefixes often
            logits = np.random.default_rng(zlib.crc32(key)).normal(size=self.vocab) * self.spread
            logits[EOS] += self.eos_bias
            self._known[key] = logits.astype(np.float32)
        return self._known[key].copy()

    def forward(self, token_ids: np.ndarray, start: int, kv_storage: PrefixKV, all_logits: bool = False) -> np.ndarray:
        """Store the tokens at start.. and return the logits after each (T, vocab), or the last (1, vocab)."""
        stored = kv_storage.tokens
        if np.any(stored[:start] < 0):
            raise AssertionError(f"position {int(np.argmax(stored[:start] < 0))} read before it was written")
        stored[start : start + len(token_ids)] = token_ids
        self.passes.append(len(token_ids))
        rows = [self.logits_after(stored[: start + t + 1]) for t in range(len(token_ids))]
        return np.stack(rows if all_logits else rows[-1:])  # (T or 1, vocab)

    def decode_step(self, kv_storage: PrefixKV):
        """One-token passes, as `Transformer.decode_step` gives them."""
        return lambda token, start: self.forward(np.asarray([token]), start, kv_storage)


class CharTokenizer:
    """Token i is the letter chr(ord('a') + i); token 0 (EOS) ends generation and adds no text."""

    def __init__(self, vocab: int = VOCAB):
        self.stop_ids = {EOS}
        self.special_tokens: dict[str, int] = {}  # no control tokens beside EOS
        self.vocab = vocab

    def token_bytes(self, token_id: int, *, special: bool = False) -> bytes:
        return b"" if token_id == EOS else bytes([ord("a") + token_id])
