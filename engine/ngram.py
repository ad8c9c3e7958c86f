"""Prompt lookup: drafts copied from where the text's last few tokens appeared before.

The drafter indexes every n-gram (n from `min_n` to `max_n`) of the prompt, the earlier
turns and the answer so far, with the position of the token that followed it, and adds
the new tokens' n-grams as the answer grows: no rescan per step. A proposal takes the
longest n-gram that ends the text and has appeared before, at its latest occurrence, and
copies what followed it. It needs no second model, and pays off where the answer copies:
code edits, summaries, quotations, the second turn of a chat.
"""

from collections.abc import Sequence

from engine.decoding import Draft


class NgramDrafter:
    """Proposes the continuation of the longest earlier match of the text's last tokens."""

    def __init__(self, min_n: int = 2, max_n: int = 4):
        if not 1 <= min_n <= max_n:
            raise ValueError(f"n-gram sizes must satisfy 1 <= min_n <= max_n, not {min_n}, {max_n}")
        self.min_n, self.max_n = min_n, max_n
        self.follows: dict[tuple[int, ...], int] = {}  # n-gram -> where the token after its latest occurrence is
        self.indexed = 0  # positions of `history` whose preceding n-grams are in `follows`

    def propose(self, history: Sequence[int], k: int) -> Draft:
        """Up to `k` tokens after the longest earlier match; none without a match.

        `history` only grows between calls (the same text, longer), so only the new
        positions are indexed.
        """
        self._index(history)
        for n in range(min(self.max_n, len(history)), self.min_n - 1, -1):
            start = self.follows.get(tuple(history[-n:]))
            if start is not None:
                return Draft(_copy(history, start, k))
        return Draft([])

    def _index(self, history: Sequence[int]) -> None:
        for position in range(max(self.indexed, 1), len(history)):
            for n in range(self.min_n, min(self.max_n, position) + 1):
                self.follows[tuple(history[position - n : position])] = position
        self.indexed = max(self.indexed, len(history))


def _copy(history: Sequence[int], start: int, k: int) -> list[int]:
    """k tokens read from `start` on; past the end the copy reads its own output, so a
    repeating stretch repeats on."""
    period = len(history) - start
    return [history[start + i] if i < period else history[start + i % period] for i in range(k)]
