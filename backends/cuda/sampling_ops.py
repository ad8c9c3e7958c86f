"""Launchers for `kernels/sampling.cu`: the next token picked on the device (greedy, or drawn
with temperature, top-k, top-p and min-p as `engine.sampling.Sampler` draws it)."""

import numpy as np

from backends.cuda.device import Device

_THREADS = 1024  # SAMPLE_THREADS


class Sampling:
    """Token choice on one device; each call is one launch of one block."""

    def __init__(self, dev: Device):
        self.dev = dev
        self._argmax = dev.function("sampling", "argmax")
        self._sample = dev.function("sampling", "sample")

    def argmax(self, logits: int, vocab: int, out: int) -> None:
        """Write to out (device int32) the first index of the largest of `vocab` float32 logits."""
        self.dev.launch(self._argmax, (1, 1, 1), (_THREADS, 1, 1), [np.uintp(logits), np.int32(vocab), np.uintp(out)])

    def sample(
        self,
        logits: int,
        vocab: int,
        temperature: float,
        top_k: int,
        top_p: float,
        uniform: float,
        out: int,
        min_p: float = 0.0,
    ) -> None:
        """Draw a token into out (device int32) from `vocab` float32 logits, as the host
        sampler's rules say: the top_k largest (0: all), then the shortest run of them, largest
        first and ties by lower id, whose probability reaches top_p (before temperature), then
        those within min_p of the best one's probability; softmax(logit / temperature) over
        what is left; the token is the first whose cumulative probability exceeds uniform
        (in [0, 1), from the host's generator) times the total. With neither top-k nor top-p
        the tokens are in vocabulary order. temperature <= 0 is greedy (argmax)."""
        if temperature <= 0.0:
            self.argmax(logits, vocab, out)
            return
        args: list[np.generic] = [
            np.uintp(logits),
            np.int32(vocab),
            np.float32(temperature),
            np.int32(top_k),
            np.float32(top_p),
        ]
        args += [np.float32(min_p), np.float32(uniform), np.uintp(out)]
        self.dev.launch(self._sample, (1, 1, 1), (_THREADS, 1, 1), args)
