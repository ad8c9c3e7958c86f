"""The cpu backend's runner: short passes recorded once, replayed in C.

A pass over a few new tokens of one sequence whose every logit is wanted (a decode step,
a speculative draft's verification, up to MAX_STEP_TOKENS) and a pass over one new token
of each of several sequences (a batched server step) are recorded the first time: the
model's forward function runs once with stand-ins (`_Slot` activations, `_StepInput`
tokens and positions), the backend's ops append their tuples to a `_Recorder` instead of
running, and the list is laid out over one preallocated arena and parsed by the kernels
(`graph`). Later passes of the same shape copy their positions and tokens into the
recorded state and replay it (`graph_run`): one C call per pass, no Python per op. A pass
is recorded once per model, shape and layout of state, and bound at each call to the
caller's states (one arena each), so a new conversation replays what the last one
recorded. Every other pass (a prefill chunk) runs op by op.
"""

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from backends.base import Forward, PassInput, Runner, Segment

_ALIGN = 16  # floats: recorded buffers start on 64-byte cache lines
MAX_STEP_TOKENS = 16  # the most new tokens of one sequence a recorded pass takes


def lines(n: int) -> int:
    """n floats rounded up to whole cache lines."""
    return -(-n // _ALIGN) * _ALIGN


class Slot:
    """A stand-in activation while a pass is recorded: a buffer of the arena, or its rows
    from `offset` (floats) on."""

    def __init__(self, recorder: "Recorder", shape: tuple[int, ...], buffer: int, offset: int = 0):
        self.recorder, self.shape, self.buffer, self.offset = recorder, shape, buffer, offset

    def reshape(self, *shape: int) -> "Slot":
        """The same buffer with another shape (as NumPy's reshape of a contiguous array)."""
        assert int(np.prod(shape)) == int(np.prod(self.shape)), (shape, self.shape)
        return Slot(self.recorder, tuple(shape), self.buffer, self.offset)

    def row(self, b: int) -> "Slot":
        """Row b, as x[b : b + 1] of an array."""
        size = int(np.prod(self.shape[1:]))
        return Slot(self.recorder, (1, *self.shape[1:]), self.buffer, self.offset + b * size)

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, index: slice) -> "Slot":
        assert index == slice(-1, None) and self.shape[0] == 1, index  # x[-1:] of a one-token step
        return self


class StepInput:
    """The tokens or the positions of a compiled pass: a view of its recorded state array.

    The positions of one sequence's new tokens stand in as the first one (`view`, one
    element) and their count (`length`): the kernels take consecutive positions from the
    first. A batch of sequences has a position per row (`per_row`, `view` holds all).
    """

    def __init__(self, view: np.ndarray, length: int, per_row: bool = False):
        self.view, self.length, self.per_row = view, length, per_row

    def __len__(self) -> int:
        return self.length


class Recorder:
    """Collects the ops of one forward pass over stand-in buffers, then lays them out in one
    arena, reusing a buffer once its last reader has run."""

    def __init__(self):
        self.ops: list[tuple] = []
        self.sizes: list[int] = []

    def new(self, shape: tuple[int, ...]) -> Slot:
        self.sizes.append(lines(int(np.prod(shape))))  # whole cache lines: aligned loads
        return Slot(self, shape, len(self.sizes) - 1)

    def build(self, output: Slot) -> tuple[list[tuple], np.ndarray]:
        """The op list with arena views in place of the stand-ins, and the output's view."""
        last_use: dict[int, int] = {}
        for i, op in enumerate(self.ops):
            for slot in _slots_in(op):
                last_use[slot.buffer] = i
        last_use[output.buffer] = len(self.ops)  # the logits are read after the last op
        placed: dict[int, int] = {}  # buffer -> offset in the arena
        free: list[tuple[int, int]] = []  # (size, offset) of space whose buffer is dead
        end = 0
        for i, op in enumerate(self.ops):
            slots = _slots_in(op)
            for slot in slots:
                if slot.buffer in placed:
                    continue
                size = self.sizes[slot.buffer]
                fits = [entry for entry in free if entry[0] >= size]
                if fits:
                    best = min(fits)
                    free.remove(best)
                    placed[slot.buffer] = best[1]
                    if best[0] > size:
                        free.append((best[0] - size, best[1] + size))
                else:
                    placed[slot.buffer] = end
                    end += size
            for buffer in {slot.buffer for slot in slots if last_use[slot.buffer] == i}:
                free.append((self.sizes[buffer], placed[buffer]))
        arena = aligned_zeros(end)

        def view(slot: Slot) -> np.ndarray:
            start = placed[slot.buffer] + slot.offset
            return arena[start : start + int(np.prod(slot.shape))]

        resolved = [_replace_slots(op, view) for op in self.ops]
        return resolved, view(output).reshape(output.shape)


def aligned_zeros(n: int) -> np.ndarray:
    """n float32 zeros starting on a cache line (64 bytes)."""
    raw = np.zeros(n + _ALIGN, dtype=np.float32)
    skip = (-raw.ctypes.data // 4) % _ALIGN
    return raw[skip : skip + n]


def _slots_in(op: tuple) -> list[Slot]:
    _code, bufs, mats, _ints, _floats = op
    found = [b for b in bufs if isinstance(b, Slot)]
    for mat in mats:
        found += [m for m in mat[4:] if isinstance(m, Slot)]
    return found


def without_kv(op: tuple) -> tuple:
    """`op` without its KV storage buffers (a recorded pass binds the caller's at each call)."""
    code, bufs, mats, ints, floats = op
    return (code, (*bufs[:7], None, None, *bufs[9:]), mats, ints, floats)


def _replace_slots(op: tuple, view: Callable[[Slot], np.ndarray]) -> tuple:
    def resolve(value: Any) -> Any:
        return view(value) if isinstance(value, Slot) else value

    code, bufs, mats, ints, floats = op
    mats = tuple(mat[:4] + tuple(resolve(m) for m in mat[4:]) for mat in mats)
    return (code, tuple(resolve(b) for b in bufs), mats, ints, floats)


class RecordingRunner(Runner):
    """Replays recorded passes where the pass's shape allows (see the module's docstring),
    and runs the rest op by op. `passes` holds what was recorded, by
    ("tokens", n, layouts) or ("batch", B, layouts)."""

    def __init__(self, backend: Any, forward: Forward):
        super().__init__(forward)
        self.backend = backend
        self.passes: dict[tuple, RecordedPass] = {}
        self.recordings = 0  # passes recorded so far

    def __call__(self, tokens: Any, segments: Sequence[Segment], all_logits: bool = False, hidden: bool = False) -> Any:
        lengths = [s.length for s in segments]
        layouts = tuple(s.state.shape for s in segments)
        if hidden:
            return super().__call__(tokens, segments, all_logits, hidden)
        if len(segments) == 1 and lengths[0] <= MAX_STEP_TOKENS and (all_logits or lengths[0] == 1):
            key: tuple = ("tokens", lengths[0], layouts[0])
        elif len(segments) > 1 and max(lengths) == 1:
            key = ("batch", len(segments), layouts)
        else:
            return super().__call__(tokens, segments, all_logits)
        recorded = self.passes.get(key) or self._record(key, segments)
        state = np.concatenate([[s.start for s in segments], np.asarray(tokens).reshape(-1)]).astype(np.int64)
        return recorded.run(state, [s.state for s in segments])

    def reset(self) -> None:
        """Drop every recorded pass (they hold the ops of the forward function as it was)."""
        self.passes.clear()

    def _record(self, key: tuple, segments: Sequence[Segment]) -> "RecordedPass":
        """Record the pass of `key` on `segments`' states (which it does not keep): its state
        array holds each segment's start, then the tokens."""
        n = len(segments)
        tokens = sum(s.length for s in segments)
        state = np.zeros(n + tokens, dtype=np.int64)
        stand_in = PassInput(
            StepInput(state[n:], tokens),
            StepInput(state[:n], tokens, per_row=n > 1),  # one sequence: consecutive from its start
            tuple(Segment(s.state, state[b : b + 1], s.length) for b, s in enumerate(segments)),
            all_logits=True,
        )
        backend = self.backend
        backend._recorder = recorder = Recorder()
        try:
            output = self.forward(stand_in)
        finally:
            backend._recorder = None
        ops, output_view = recorder.build(output)
        graph = backend.native.graph(ops, state, output_view, tuple(s.state.arena for s in segments))
        ops[:] = [without_kv(op) for op in ops]  # parsed: the graph keeps the list, not these states
        self.recordings += 1
        recorded = self.passes[key] = RecordedPass(backend.native, graph, output_view.shape)
        return recorded


class RecordedPass:
    """A forward pass parsed by the kernels (`graph`), replayed on any storages of the shape it was recorded on."""

    def __init__(self, native: Any, graph: Any, output_shape: tuple[int, ...]):
        self.native, self.graph, self.output_shape = native, graph, output_shape
        self.runs = 0

    def run(self, state: np.ndarray, caches: list[Any]) -> np.ndarray:
        """Run with `state` (positions and tokens) on `caches`; the logits, a new array (the
        arena is reused by the next pass)."""
        out = np.empty(self.output_shape, dtype=np.float32)
        self.native.graph_run(self.graph, state, out, tuple(cache.arena for cache in caches))
        self.runs += 1
        return out
