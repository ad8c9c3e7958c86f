"""The CUDA backend's runner: one-token passes recorded once as a device graph, then replayed.

A decode step of one sequence launches the same kernels on the same buffers every time;
only its token and position change. The runner keeps both in device memory (`Staged`
stand-ins that the ops recognise and read from there instead of uploading), records the
step's launches once per sequence state (`Device.begin_capture`), and from then on copies
the new token and position in and replays the graph: one launch of the whole step instead
of hundreds of Python calls and kernel launches. The first one-token pass of a state runs
op by op (it makes the constants and buffers the step uses), the second is recorded.
Every buffer the recording takes stays the graph's own; the logits are copied out of it,
so a caller may keep them while the next step replays. Longer passes run op by op.
"""

import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np

from backends.base import Forward, PassInput, Runner, Segment, positions_of
from backends.cuda.device import Device, Graph
from backends.cuda.tensors import F32, Buffer, BufferPool, DeviceTensor, DeviceToken


class StagedInts(np.ndarray):
    """Host ints whose device copy a runner holds (`staged`, anything with `.ptr`)."""

    staged: Any = None


class StagedStart(int):
    """A segment's start whose positions' device copy a runner holds (`staged`)."""

    staged: Any = None


class DeviceInts:
    """A small int32 device buffer the runner owns and rewrites before each replay."""

    def __init__(self, device: Device):
        self.device = device
        self.ptr = device.alloc(4)

    def set(self, value: int | DeviceToken) -> None:
        """Write `value`, a host int or a token on the device (copied there, in stream order)."""
        if isinstance(value, DeviceToken):
            self.device.copy(self.ptr, value.ptr, 4)
        else:
            self.device.upload(self.ptr, np.array([value], dtype=np.int32))


class RecordedStep:
    """One state's recorded decode step: its graph, its buffers, its logits."""

    def __init__(self, graph: Graph, held: list[Buffer], logits: DeviceTensor):
        self.graph, self.held, self.logits = graph, held, logits


class GraphRunner(Runner):
    """Runs a model's passes on the CUDA backend, replaying recorded one-token steps."""

    def __init__(self, device: Device, pool: BufferPool, forward: Forward):
        super().__init__(forward)
        self.device, self.pool = device, pool
        self.token, self.position = DeviceInts(device), DeviceInts(device)
        self.replays = 0  # steps replayed from a recording, all states together
        self._seen: weakref.WeakSet[Any] = weakref.WeakSet()
        self._steps: weakref.WeakKeyDictionary[Any, RecordedStep] = weakref.WeakKeyDictionary()

    def reset(self) -> None:
        """Forget the recorded steps: the forward function computes other numbers now."""
        self._seen = weakref.WeakSet()
        self._steps = weakref.WeakKeyDictionary()

    def __call__(self, tokens: Any, segments: Sequence[Segment], all_logits: bool = False, hidden: bool = False) -> Any:
        """As `Runner.__call__`; one-token passes of one sequence replay its recorded step.
        Such a pass also takes its token as `argmax` left it on the device."""
        on_device = len(tokens) == 1 and isinstance(tokens[0], DeviceToken)
        if not on_device:
            tokens = np.asarray(tokens, dtype=np.int64)
        if len(tokens) != 1 or len(segments) != 1 or hidden:
            return self.forward(PassInput(tokens, positions_of(segments), tuple(segments), all_logits, hidden))
        state, start = segments[0].state, int(segments[0].start)
        step = self._steps.get(state)
        self.token.set(tokens[0] if on_device else int(tokens[0]))
        self.position.set(start)
        if step is None and state not in self._seen:  # the first step of a state runs op by op
            self._seen.add(state)
            return self.forward(self._staged_input(state, start))
        if step is None:
            step = self._record(state, start)
            self._steps[state] = step
        else:
            step.graph.replay()
            self.replays += 1
        out = DeviceTensor(Buffer(self.pool, F32 * step.logits.size), step.logits.shape)
        self.device.copy(out.ptr, step.logits.ptr, F32 * step.logits.size)
        return out

    def _staged_input(self, state: Any, start: int) -> PassInput:
        """A one-token pass whose token and position the ops read from the runner's device
        buffers (the host values are stand-ins: the token may be on the device only)."""
        tokens = np.zeros(1, dtype=np.int64).view(StagedInts)
        tokens.staged = self.token
        positions = np.array([start], dtype=np.int64).view(StagedInts)
        positions.staged = self.position
        at = StagedStart(start)
        at.staged = self.position
        return PassInput(tokens, positions, (Segment(state, at, 1),), True)

    def _record(self, state: Any, start: int) -> RecordedStep:
        """Record the step of `state` at `start` (and run it once: capture does not run it)."""
        held: list[Buffer] = []
        self.pool.holding = held
        self.device.begin_capture()
        try:
            logits = self.forward(self._staged_input(state, start))
        finally:
            graph = self.device.end_capture()
            self.pool.holding = None
        graph.replay()
        return RecordedStep(graph, held, logits)
