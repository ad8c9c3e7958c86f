"""The CUDA backend: the op set of `backends.base` over a `Device` (a GPU through PyCUDA, or
the CPU emulator of the same kernels).

Activations are float32 `DeviceTensor`s: a shape over a buffer of device memory, reshaped
and sliced by rows without copying. Matrices stay as their GGUF blocks on the device and
are multiplied in place (`products`); norms, rope and the elementwise ops (`pointwise`),
attention over an f16 KV cache (`attention_ops`) and greedy picks (`sampling_ops`) are
kernels of their own. Buffers come from a pool of power-of-two sizes and go back to it
when their last tensor is dropped: the stream runs launches in order, so a buffer handed
out again is written only after the kernels that read it before.

What this version runs on the host instead (mixture-of-experts routing and experts, the
Gated DeltaNet's convolution and rule: the CUDA breadth issue's) goes through the NumPy
reference, tensors copied each way, and `load_notes` says so once a model uses it.
"""

import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np

from backends.base import (
    AttentionState,
    Backend,
    DeltaNetLayer,
    ExpertWeights,
    Forward,
    LayerAttention,
    LayerState,
    Routing,
    Runner,
    WeightSpec,
)
from backends.cuda.attention_ops import Attention, LayerCache
from backends.cuda.device import Device
from backends.cuda.graph_runner import GraphRunner
from backends.cuda.pointwise import Pointwise
from backends.cuda.products import DeviceMatrix, Products, join_matrices, upload_matrix
from backends.cuda.sampling_ops import Sampling
from backends.cuda.tensors import F32, Buffer, BufferPool, DeviceTensor, DeviceToken
from backends.dequant import dequantize
from backends.memory import MAPPED_WEIGHTS
from backends.numpy_backend import NumpyBackend

_HOST_BUDGET = 1 << 30  # float32 bytes the host fallback may cache (experts' matrices)


class DeviceVector:
    """A float32 vector on the device (a norm's weight, a bias), with its host copy."""

    def __init__(self, device: Device, host: np.ndarray):
        self.host = np.ascontiguousarray(host, dtype=np.float32)
        self.ptr = device.to_device(self.host)
        self.shape = self.host.shape


class JoinedMatrix:
    """Matrices on one input joined by rows (`fuse_linear`): one product for a one-token pass,
    and each part, a view of the joined blocks, for longer ones."""

    def __init__(self, joined: DeviceMatrix, parts: list[DeviceMatrix]):
        self.joined, self.parts = joined, parts


class CudaState:
    """One sequence's per-layer state: attention layer i's f16 keys and values on the device
    (`caches[i]`, a `LayerCache`), a recurrent layer's float32 arrays on the host
    (`arrays[i]`, run by the host fallback)."""

    def __init__(self, device: Device, layers: list[LayerState]):
        self.layers = tuple(layers)
        self.caches: list[LayerCache | None] = []
        self.arrays: list[tuple[np.ndarray, ...]] = []
        self._device = device
        for layer in self.layers:
            if isinstance(layer, AttentionState):
                keys = _zeros(device, 2 * layer.kv_heads * layer.slots * layer.head_dim)
                values = _zeros(device, 2 * layer.kv_heads * layer.slots * layer.value_dim)
                cache = LayerCache(
                    keys, values, layer.kv_heads, layer.slots, layer.head_dim, layer.value_dim, layer.ring
                )
                self.caches.append(cache)
                self.arrays.append(())
            else:
                self.caches.append(None)
                self.arrays.append(tuple(np.zeros(shape, dtype=np.float32) for shape in layer.shapes))
        buffers = [ptr for c in self.caches if c is not None for ptr in (c.keys, c.values)]
        self._release = weakref.finalize(self, _free_buffers, device, buffers)  # a dropped conversation's cache

    def cache_bytes(self) -> int:
        """Bytes the attention layers' keys and values take on the device."""
        return sum(2 * c.kv_heads * c.slots * (c.head_dim + c.value_dim) for c in self.caches if c is not None)

    def free(self) -> None:
        """Give the keys and values back to the device now (otherwise when the state is dropped)."""
        self._release()
        self.caches = [None for _ in self.caches]


def _free_buffers(device: Device, buffers: list[int]) -> None:
    for ptr in buffers:
        device.free(ptr)


def _zeros(device: Device, nbytes: int) -> int:
    ptr = device.alloc(max(nbytes, 1))
    device.memset(ptr, 0, nbytes)
    return ptr


class CudaBackend(Backend):
    """The op set on a CUDA device, with our kernels; the dense transformer path entirely on it."""

    name = "cuda"
    memory_rule = MAPPED_WEIGHTS
    kv_types = ("f16",)
    device_tokens = True
    device_sampling = True

    def __init__(self, device: Device):
        self.device = device
        self.pool = BufferPool(device)
        self.products = Products(device)
        self.pointwise = Pointwise(device)
        self.attention_ops = Attention(device)
        self.sampling = Sampling(device)
        self._host = NumpyBackend(memory_budget_bytes=_HOST_BUDGET)
        self._notes: list[str] = []
        self._host_ops: set[str] = set()
        self._constants: dict[int, tuple[np.ndarray, int]] = {}  # id(host array) -> (array, device copy)
        self._moved: dict[int, tuple[DeviceMatrix, DeviceMatrix]] = {}  # id(matrix) -> (it, its view once joined)
        self._states: weakref.WeakSet[CudaState] = weakref.WeakSet()  # live states, freed at close

    @property
    def device_name(self) -> str:
        return self.device.description

    @property
    def load_notes(self) -> list[str]:
        notes = list(self._notes)
        if self._host_ops:
            notes.append(
                "The CUDA backend runs "
                + ", ".join(sorted(self._host_ops))
                + " on the CPU for now (NumPy), copying activations each way: this model is slower than it will be."
            )
        return notes

    def runner(self, forward: Forward) -> Runner:
        """One-token passes of one sequence recorded once as a device graph and replayed."""
        return GraphRunner(self.device, self.pool, forward)

    # -- tensors -----------------------------------------------------------------------

    def empty(self, *shape: int) -> DeviceTensor:
        """A new float32 tensor of `shape`, uninitialised."""
        n = int(np.prod(shape))
        return DeviceTensor(Buffer(self.pool, F32 * n), shape)

    def upload(self, host: np.ndarray) -> DeviceTensor:
        """A new tensor holding `host` as float32."""
        host = np.ascontiguousarray(host, dtype=np.float32)
        out = self.empty(*host.shape)
        self.device.upload(out.ptr, host)
        return out

    def ints(self, values: Any) -> Any:
        """Host ints (tokens, positions) as a device int32 buffer (anything with `.ptr`, kept
        alive by the caller until its launch is queued), or the buffer a graph runner staged
        for them (`graph_runner.Staged`)."""
        staged = getattr(values, "staged", None)
        if staged is not None:
            return staged
        host = np.ascontiguousarray(np.asarray(values, dtype=np.int32))
        buffer = Buffer(self.pool, 4 * max(host.size, 1))
        self.device.upload(buffer.ptr, host)
        return buffer

    def constant(self, host: np.ndarray | None) -> int:
        """A device copy of a model's constant float32 array (freq factors, sinks), made once; 0 for None."""
        if host is None:
            return 0
        found = self._constants.get(id(host))
        if found is None:
            found = (host, self.device.to_device(np.ascontiguousarray(host, dtype=np.float32)))
            self._constants[id(host)] = found
        return found[1]

    def to_host(self, x: DeviceTensor | DeviceToken | np.ndarray) -> np.ndarray:
        if isinstance(x, np.ndarray):
            return np.asarray(x, dtype=np.float32)
        if isinstance(x, DeviceToken):  # ids below 2**24 are exact in float32
            return self.device.from_device(x.ptr, (1,), np.int32).astype(np.float32)
        return self.device.from_device(x.ptr, x.shape, np.float32)

    def argmax(self, logits: DeviceTensor) -> DeviceToken:
        """The greedy token after the last row, picked on the device and left there: the next
        step reads it from there, and reading it back costs a 4-byte copy."""
        last = logits[-1:] if logits.ndim > 1 else logits
        token = DeviceToken(Buffer(self.pool, 4))
        self.sampling.argmax(last.ptr, logits.shape[-1], token.ptr)
        return token

    def sample_token(
        self, logits: DeviceTensor, temperature: float, top_k: int, top_p: float, min_p: float, uniform: float
    ) -> DeviceToken:
        """A token drawn on the device after the last row (see `Backend.sample_token`), left there."""
        last = logits[-1:] if logits.ndim > 1 else logits
        token = DeviceToken(Buffer(self.pool, 4))
        self.sampling.sample(last.ptr, logits.shape[-1], temperature, top_k, top_p, uniform, token.ptr, min_p=min_p)
        return token

    def _host_op(self, name: str) -> None:
        self._host_ops.add(name)

    def _on_host(self, x: Any) -> np.ndarray:
        return self.to_host(x) if isinstance(x, DeviceTensor) else np.asarray(x, dtype=np.float32)

    # -- weights -----------------------------------------------------------------------

    def prepare_weight(self, spec: WeightSpec) -> Any:
        if len(spec.shape) == 1 or spec.name.endswith(".bias"):
            if len(spec.shape) == 1:
                return DeviceVector(self.device, dequantize(spec.raw, spec.ggml_type, spec.shape))
            self._host_op("mixture-of-experts layers")
            return self._host.prepare_weight(spec)
        if len(spec.shape) == 3:
            self._host_op("mixture-of-experts layers")
            return self._host.prepare_weight(spec)
        matrix, note = upload_matrix(self.device, spec)
        if note is not None and note not in self._notes:
            self._notes.append(note)
        return matrix

    def fuse_linear(self, weights: list[Any]) -> Any:
        joined = join_matrices(self.device, weights) if all(isinstance(w, DeviceMatrix) for w in weights) else None
        if joined is None:
            return tuple(weights)
        row_bytes = [w.nbytes // w.rows for w in weights]
        parts, first = [], 0
        for w, per_row in zip(weights, row_bytes, strict=True):
            parts.append(DeviceMatrix(joined.ptr + first * per_row, w.ggml_type, w.rows, w.cols, w.nbytes))
            first += w.rows
        for w, part in zip(weights, parts, strict=True):  # each part is a view of the joined blocks now
            self.device.free(w.ptr)
            self._moved[id(w)] = (w, part)
        return JoinedMatrix(joined, parts)

    def linear_fused(self, x: DeviceTensor, fused: Any, biases: tuple[Any, ...]) -> list[DeviceTensor]:
        if not isinstance(fused, JoinedMatrix) or len(x) != 1 or any(b is not None for b in biases):
            parts = fused.parts if isinstance(fused, JoinedMatrix) else fused
            return [self.linear(x, w, b) for w, b in zip(parts, biases, strict=True)]
        out = self.linear(x, fused.joined)  # (1, sum of the outs)
        views, lo = [], 0
        for part in fused.parts:
            views.append(DeviceTensor(out.buffer, (1, part.rows), out.offset + lo))
            lo += part.rows
        return views

    # -- ops ---------------------------------------------------------------------------

    def embedding(self, weight: DeviceMatrix, token_ids: np.ndarray, scale: float = 1.0) -> DeviceTensor:
        n = len(token_ids)
        out = self.empty(n, weight.cols)
        ids = self.ints(token_ids)
        self.products.rows(weight, ids.ptr, n, out.ptr, scale)
        return out

    def linear(self, x: DeviceTensor, weight: Any, bias: Any = None) -> DeviceTensor:
        if not isinstance(weight, DeviceMatrix):
            raise TypeError(f"the CUDA backend cannot multiply by {type(weight).__name__}")
        moved = self._moved.get(id(weight))
        if moved is not None:  # a matrix joined with others (`fuse_linear`): its blocks' new place
            weight = moved[1]
        n = len(x)
        if x.ptr % 16:  # the products read activations 16 bytes at a time: a view of odd rows is copied
            x = self.copy_of(x)
        out = self.empty(n, weight.rows)
        self.products.linear(x.ptr, n, weight, out.ptr, 0 if bias is None else bias.ptr)
        return out

    def copy_of(self, x: DeviceTensor) -> DeviceTensor:
        """A new tensor (on an aligned buffer of its own) holding x's elements."""
        out = self.empty(*x.shape)
        self.device.copy(out.ptr, x.ptr, F32 * x.size)
        return out

    def rms_norm(self, x: DeviceTensor, weight: DeviceVector, eps: float) -> DeviceTensor:
        out = self.empty(*x.shape)
        dim = x.shape[-1]
        self.pointwise.rms_norm(x.ptr, x.size // dim, dim, weight.ptr, eps, out.ptr)
        return out

    def layer_norm(self, x: DeviceTensor, weight: DeviceVector, bias: DeviceVector | None, eps: float) -> DeviceTensor:
        out = self.empty(*x.shape)
        dim = x.shape[-1]
        self.pointwise.layer_norm(x.ptr, x.size // dim, dim, weight.ptr, 0 if bias is None else bias.ptr, eps, out.ptr)
        return out

    def rope(
        self,
        x: DeviceTensor,
        positions: np.ndarray,
        base: float,
        rope_dim: int,
        neox: bool,
        freq_factors: np.ndarray | None = None,
        mscale: float = 1.0,
    ) -> DeviceTensor:
        n, heads, head_dim = x.shape
        out = self.empty(*x.shape)
        at = self.ints(positions)
        self.pointwise.rope(
            x.ptr,
            n,
            heads,
            head_dim,
            at.ptr,
            base,
            rope_dim,
            neox,
            self.constant(freq_factors),
            mscale,
            out.ptr,
        )
        return out

    def attention(
        self,
        q: DeviceTensor,
        k: DeviceTensor,
        v: DeviceTensor,
        cache: CudaState,
        layer: int,
        start: int,
        settings: LayerAttention,
    ) -> DeviceTensor:
        n, heads, _ = q.shape
        layer_cache = _attention_cache(cache, layer)
        state = cache.layers[layer]
        assert isinstance(state, AttentionState)
        if state.ring and (settings.window is None or settings.window + n - 1 > state.slots):
            raise ValueError(
                f"a pass of {n} tokens over a window of {settings.window} does not fit layer {layer}'s "
                f"ring of {state.slots} slots: split it"
            )
        at = self.ints(start if hasattr(start, "staged") else np.arange(start, start + n))
        self.attention_ops.write(k.ptr, v.ptr, n, layer_cache, at.ptr)
        out = self.empty(n, heads * layer_cache.value_dim)
        self.attention_ops.attend(
            q.ptr, n, heads, layer_cache, at.ptr, settings.scale, settings.window, settings.softcap,
            self.constant(settings.sinks), settings.causal, out.ptr,
        )  # fmt: skip
        return out

    def attention_batch(
        self,
        q: DeviceTensor,
        k: DeviceTensor,
        v: DeviceTensor,
        caches: list[Any],
        layer: int,
        starts: list[int],
        settings: LayerAttention,
    ) -> DeviceTensor:
        b, heads, _ = q.shape
        layer_caches = [_attention_cache(c, layer) for c in caches]
        at = self.ints(starts)
        for row, layer_cache in enumerate(layer_caches):
            self.attention_ops.write(k[row : row + 1].ptr, v[row : row + 1].ptr, 1, layer_cache, at.ptr + 4 * row)
        out = self.empty(b, heads * layer_caches[0].value_dim)
        self.attention_ops.attend_batch(
            q.ptr, b, heads, layer_caches, at.ptr, settings.scale, settings.window,
            settings.softcap, self.constant(settings.sinks), out.ptr,
        )  # fmt: skip
        return out

    def gated_activation(self, gate: DeviceTensor, up: DeviceTensor, kind: str) -> DeviceTensor:
        rows, cols = len(up), up.size // len(up)
        out = self.empty(*up.shape)
        self.pointwise.gated(gate.ptr, up.ptr, rows, cols, kind, out.ptr, gate_cols=gate.size // len(gate))
        return out

    def activation(self, x: DeviceTensor, kind: str) -> DeviceTensor:
        out = self.empty(*x.shape)
        self.pointwise.activation(x.ptr, x.size, kind, out.ptr)
        return out

    def scale(self, x: DeviceTensor, factor: float) -> DeviceTensor:
        out = self.empty(*x.shape)
        self.pointwise.scale(x.ptr, x.size, factor, out.ptr)
        return out

    def add(self, a: DeviceTensor, b: DeviceTensor | DeviceVector) -> DeviceTensor:
        out = self.empty(*a.shape)
        self.pointwise.add(a.ptr, b.ptr, a.size, out.ptr)
        return out

    def softcap(self, x: DeviceTensor, cap: float) -> DeviceTensor:
        out = self.empty(*x.shape)
        self.pointwise.softcap(x.ptr, x.size, cap, out.ptr)
        return out

    def columns(self, x: DeviceTensor, start: int, count: int) -> DeviceTensor:
        n, width = x.shape
        out = self.empty(n, count)
        for row in range(n):
            self.device.copy(out.ptr + F32 * row * count, x.ptr + F32 * (row * width + start), F32 * count)
        return out

    # -- what runs on the host for now (the CUDA breadth issue's) ------------------------

    def route(self, logits: DeviceTensor, routing: Routing) -> DeviceTensor:
        self._host_op("mixture-of-experts layers")
        return self.upload(self._host.route(self._on_host(logits), routing))

    def experts(self, x: DeviceTensor, choice: DeviceTensor, weights: ExpertWeights, activation: str) -> DeviceTensor:
        self._host_op("mixture-of-experts layers")
        return self.upload(self._host.experts(self._on_host(x), self._on_host(choice), weights, activation))

    def short_conv(self, x: DeviceTensor, weight: np.ndarray, states: Sequence[Any], layer: int) -> DeviceTensor:
        self._host_op("Gated DeltaNet layers")
        return self.upload(self._host.short_conv(self._on_host(x), weight, states, layer))

    def delta_net(
        self,
        x: DeviceTensor,
        alpha: DeviceTensor,
        beta: DeviceTensor,
        settings: DeltaNetLayer,
        states: Sequence[Any],
        layer: int,
    ) -> DeviceTensor:
        self._host_op("Gated DeltaNet layers")
        host = self._host.delta_net(
            self._on_host(x), self._on_host(alpha), self._on_host(beta), settings, states, layer
        )  # (T, Hv * Dh)
        return self.upload(host)

    # -- state -------------------------------------------------------------------------

    def allocate_state(self, layers: list[LayerState]) -> CudaState:
        state = CudaState(self.device, layers)
        self._states.add(state)
        return state

    def state_bytes(self, state: CudaState) -> int:
        return state.cache_bytes() + sum(a.nbytes for arrays in state.arrays for a in arrays)

    def state_arrays(self, state: CudaState) -> list[np.ndarray]:
        """Host copies of the keys and values (f16, as stored), then the recurrent arrays."""
        found: list[np.ndarray] = []
        for c in state.caches:
            if c is not None:
                found.append(self.device.from_device(c.keys, (c.kv_heads, c.slots, c.head_dim), np.float16))
                found.append(self.device.from_device(c.values, (c.kv_heads, c.slots, c.value_dim), np.float16))
        found.extend(a for arrays in state.arrays for a in arrays)
        return found

    def load_state_arrays(self, state: CudaState, arrays: list[np.ndarray]) -> None:
        """Upload the keys and values that `state_arrays`' copies now hold (the recurrent
        arrays are the state's own)."""
        held = iter(arrays)
        for cache in state.caches:
            if cache is not None:
                self.device.upload(cache.keys, np.ascontiguousarray(next(held), dtype=np.float16))
                self.device.upload(cache.values, np.ascontiguousarray(next(held), dtype=np.float16))

    def forget(self, state: CudaState, start: int, end: int) -> None:
        """Zero positions start .. end-1 of every attention layer (a ring's at p % slots), and
        from `start` 0 the recurrent arrays too, so a rolled-back state equals a fresh one."""
        for layer, cache, arrays in zip(state.layers, state.caches, state.arrays, strict=True):
            if cache is None or not isinstance(layer, AttentionState):
                for array in arrays if start == 0 else ():
                    array[:] = 0.0
                continue
            slots = sorted({p % layer.slots for p in range(start, end)} if layer.ring else range(start, end))
            for lo, hi in _runs(slots):
                for head in range(cache.kv_heads):
                    for ptr, width in ((cache.keys, cache.head_dim), (cache.values, cache.value_dim)):
                        first = (head * cache.slots + lo) * width * 2
                        self.device.memset(ptr + first, 0, (hi - lo) * width * 2)

    def close(self) -> None:
        self.attention_ops.close()
        self.products.close()
        for state in list(self._states):
            state.free()
        self._states.clear()
        for _, ptr in self._constants.values():
            self.device.free(ptr)
        self._constants.clear()
        self._host.close()


def _attention_cache(state: CudaState, layer: int) -> LayerCache:
    cache = state.caches[layer]
    if cache is None:
        raise ValueError(f"layer {layer} keeps a recurrent state, not keys and values")
    return cache


def _runs(slots: list[int]) -> list[tuple[int, int]]:
    """Sorted slot numbers as (first, end) runs of consecutive ones."""
    runs: list[tuple[int, int]] = []
    for s in slots:
        if runs and runs[-1][1] == s:
            runs[-1] = (runs[-1][0], s + 1)
        else:
            runs.append((s, s + 1))
    return runs
