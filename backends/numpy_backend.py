"""The NumPy backend: the reference every other backend is measured against.

Weights stay quantized in the memory-mapped model file. Each matrix is dequantized to
float32 when the model is prepared (so loading shows real progress and the first answer
is not slow) and kept in a cache with a memory budget; once the budget is spent, further
matrices are dequantized again on every use, a slice of rows at a time, so an 8B model
still runs on a 24 GB machine (slowly) instead of failing.
The cache never evicts: a forward pass visits every weight in the same order, so evicting
the least recently used one would make every access a miss.
"""

import os
from itertools import pairwise

import numpy as np

from backends.base import AttentionState, Backend, ExpertWeights, LayerAttention, LayerState, Routing, WeightSpec
from backends.delta_rule import HostDeltaNet
from backends.dequant import dequantize, dequantize_rows
from backends.kv_types import decode_rows, encode_rows, kv_storage
from backends.memory import DEQUANTIZED_WEIGHTS, available_memory_bytes, default_cache_budget

_STREAM_CHUNK_BYTES = 64 << 20  # float32 bytes dequantized at once for an uncached matrix
_SCORE_FLOATS = 16 << 20  # attention scores made at once: a long prompt's pass takes its queries in turn
SWIGLU_ALPHA, SWIGLU_LIMIT = 1.702, 7.0  # gpt-oss's clamped SwiGLU ("swiglu_oai")


class DequantCache:
    """Float32 copies of weight matrices, filled first come first served up to a budget."""

    def __init__(self, budget_bytes: int):
        self.budget_bytes = budget_bytes
        self.used_bytes = 0
        self._dense: dict[str, np.ndarray] = {}

    def get(self, spec: WeightSpec) -> np.ndarray | None:
        """The float32 matrix of `spec`, dequantizing and caching it if the budget allows."""
        dense = self._dense.get(spec.name)
        if dense is None:
            size = 4 * int(np.prod(spec.shape))
            if self.used_bytes + size > self.budget_bytes:
                return None
            dense = dequantize(spec.raw, spec.ggml_type, spec.shape)
            self._dense[spec.name] = dense
            self.used_bytes += size
        return dense

    def peek(self, name: str) -> np.ndarray | None:
        """The cached float32 matrix called `name`, or None; never dequantizes."""
        return self._dense.get(name)

    def share(self, names: list[str], joined: np.ndarray, bounds: np.ndarray) -> None:
        """Make the cached matrices `names` views of `joined` (rows bounds[i]:bounds[i+1]),
        so a joined copy costs no memory beyond a moment while it is built."""
        for name, lo, hi in zip(names, bounds[:-1], bounds[1:], strict=True):
            self._dense[name] = joined[lo:hi]

    def clear(self) -> None:
        """Drop every cached matrix."""
        self._dense.clear()
        self.used_bytes = 0


class NumpyWeight:
    """A weight as the NumPy backend holds it: the GGUF blocks plus the shared cache."""

    def __init__(self, spec: WeightSpec, cache: DequantCache):
        self.spec = spec
        self.cache = cache

    def rows(self, index: np.ndarray) -> np.ndarray:
        """Dequantized rows `index` of a matrix, without dequantizing the rest: (len(index), in)."""
        dense = self.cache.peek(self.spec.name)
        if dense is not None:
            return dense[index]
        return dequantize_rows(self.spec.raw, self.spec.ggml_type, self.spec.shape, index)

    def matmul_transposed(self, x: np.ndarray) -> np.ndarray:
        """x (T, in) @ W.T -> (T, out), streaming row slices when W is not cached."""
        dense = self.cache.get(self.spec)
        if dense is not None:
            return x @ dense.T
        n_out, n_in = self.spec.shape
        step = max(1, _STREAM_CHUNK_BYTES // (4 * n_in))
        out = np.empty((x.shape[0], n_out), dtype=np.float32)
        for lo in range(0, n_out, step):
            index = np.arange(lo, min(lo + step, n_out))
            out[:, lo : lo + step] = x @ self.rows(index).T
        return out


class NumpyExperts:
    """A stack of expert matrices (E, out, in): each expert's rows read, or cached, on their
    own, so an expert no token chose is never dequantized."""

    def __init__(self, spec: WeightSpec, cache: DequantCache):
        self.n_experts, self.rows_per_expert, _ = spec.shape
        self.spec, self.cache = spec, cache
        self._row_bytes = spec.raw.size // (self.n_experts * self.rows_per_expert)

    def expert(self, e: int) -> NumpyWeight:
        """Expert e's matrix (out, in), a view of its blocks."""
        lo = int(e) * self.rows_per_expert * self._row_bytes
        raw = self.spec.raw.reshape(-1)[lo : lo + self.rows_per_expert * self._row_bytes]
        shape = (self.rows_per_expert, self.spec.shape[2])
        return NumpyWeight(WeightSpec(f"{self.spec.name}[{int(e)}]", raw, self.spec.ggml_type, shape), self.cache)


class JoinedWeights:
    """Cached matrices on one input, joined by rows so one product reads them all."""

    def __init__(self, matrix: np.ndarray, bounds: np.ndarray):
        self.matrix = matrix  # (sum of the outs, in)
        self.bounds = bounds  # row where each part starts, then the total


class NumpyState:
    """One sequence's per-layer state: attention layer i has keys (Hkv, slots, Dh) and
    values (Hkv, slots, Dv) in `keys[i]` and `values[i]`, stored as the layer's KV type
    (`backends.kv_types.kv_storage`: Q8_0's last axis counts blocks of 32), position p at
    slot p, or at slot p % slots for a windowed ring; a recurrent layer's arrays are
    `arrays[i]`, float32."""

    def __init__(self, layers: list[LayerState]):
        self.layers = tuple(layers)
        self.keys: list[np.ndarray | None] = []
        self.values: list[np.ndarray | None] = []
        self.arrays: list[tuple[np.ndarray, ...]] = []
        for layer in self.layers:
            if isinstance(layer, AttentionState):
                self.keys.append(kv_storage(layer.kv_type, (layer.kv_heads, layer.slots, layer.head_dim)))
                self.values.append(kv_storage(layer.kv_type, (layer.kv_heads, layer.slots, layer.value_dim)))
                self.arrays.append(())
            else:
                self.keys.append(None)
                self.values.append(None)
                self.arrays.append(tuple(np.zeros(shape, dtype=np.float32) for shape in layer.shapes))


class NumpyBackend(HostDeltaNet, Backend):
    """Runs every op with NumPy on the CPU, in float32."""

    name = "numpy"
    memory_rule = DEQUANTIZED_WEIGHTS

    def __init__(self, memory_budget_bytes: int | None = None):
        if memory_budget_bytes is None:
            memory_budget_bytes = default_cache_budget(available_memory_bytes())
        self.cache = DequantCache(memory_budget_bytes)

    @property
    def device_name(self) -> str:
        return f"CPU ({os.cpu_count()} cores, NumPy float32)"

    def prepare_weight(self, spec: WeightSpec) -> np.ndarray | NumpyWeight | NumpyExperts:
        if len(spec.shape) == 1 or spec.name.endswith(".bias"):  # norms and biases (experts': (E, F)): float32
            return dequantize(spec.raw, spec.ggml_type, spec.shape)
        if len(spec.shape) == 3:
            return NumpyExperts(spec, self.cache)
        self.cache.get(spec)  # dequantize now while the budget lasts
        return NumpyWeight(spec, self.cache)

    def embedding(self, weight: NumpyWeight, token_ids: np.ndarray, scale: float = 1.0) -> np.ndarray:
        rows = weight.rows(np.asarray(token_ids, dtype=np.int64))
        return rows * np.float32(scale) if scale != 1.0 else rows

    def linear(self, x: np.ndarray, weight: NumpyWeight, bias: np.ndarray | None = None) -> np.ndarray:
        out = weight.matmul_transposed(x)
        if bias is not None:
            out += bias
        return out

    def fuse_linear(self, weights: list[NumpyWeight]) -> JoinedWeights | tuple:
        """Join cached matrices into one, so decoding makes one product instead of several
        small ones (~15% faster on SmolLM2's layers). Streamed ones stay apart."""
        peeked = [self.cache.peek(w.spec.name) for w in weights]
        dense = [d for d in peeked if d is not None]
        if len(dense) != len(peeked) or len({d.shape[1] for d in dense}) != 1:
            return super().fuse_linear(weights)
        bounds = np.cumsum([0, *(d.shape[0] for d in dense)])
        joined = np.concatenate(dense)  # (sum of the outs, in)
        self.cache.share([w.spec.name for w in weights], joined, bounds)
        return JoinedWeights(joined, bounds)

    def linear_fused(
        self, x: np.ndarray, fused: JoinedWeights | tuple, biases: tuple[np.ndarray | None, ...]
    ) -> list[np.ndarray]:
        if not isinstance(fused, JoinedWeights):
            return super().linear_fused(x, fused, biases)
        out = x @ fused.matrix.T  # (T, sum of the outs)
        parts = [out[:, lo:hi] for lo, hi in pairwise(fused.bounds)]
        for part, bias in zip(parts, biases, strict=True):
            if bias is not None:
                part += bias
        return parts

    def rms_norm(self, x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
        mean_square = np.mean(np.square(x), axis=-1, keepdims=True)
        return (x / np.sqrt(mean_square + np.float32(eps))) * weight

    def layer_norm(self, x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None, eps: float) -> np.ndarray:
        centred = x - x.mean(axis=-1, keepdims=True, dtype=np.float64).astype(np.float32)
        variance = np.mean(np.square(centred, dtype=np.float64), axis=-1, keepdims=True)
        out = centred / np.sqrt(variance.astype(np.float32) + np.float32(eps)) * weight
        return out if bias is None else out + bias

    def rope(
        self,
        x: np.ndarray,
        positions: np.ndarray,
        base: float,
        rope_dim: int,
        neox: bool,
        freq_factors: np.ndarray | None = None,
        mscale: float = 1.0,
    ) -> np.ndarray:
        half = rope_dim // 2
        inv_freq = base ** (-np.arange(half, dtype=np.float64) * 2.0 / rope_dim)
        if freq_factors is not None:
            inv_freq = inv_freq / freq_factors
        angles = np.outer(np.asarray(positions, dtype=np.float64), inv_freq)  # (T, half)
        cos = (np.cos(angles) * mscale).astype(np.float32)[:, None, :]  # (T, 1, half)
        sin = (np.sin(angles) * mscale).astype(np.float32)[:, None, :]  # (T, 1, half)
        out = x.copy()
        if neox:
            a, b = x[..., :half], x[..., half:rope_dim]
            out[..., :half] = a * cos - b * sin
            out[..., half:rope_dim] = a * sin + b * cos
        else:
            a, b = x[..., 0:rope_dim:2], x[..., 1:rope_dim:2]
            out[..., 0:rope_dim:2] = a * cos - b * sin
            out[..., 1:rope_dim:2] = a * sin + b * cos
        return out

    def attention(
        self,
        q: np.ndarray,
        k: np.ndarray,
        v: np.ndarray,
        cache: NumpyState,
        layer: int,
        start: int,
        settings: LayerAttention,
    ) -> np.ndarray:
        """As the contract says. A ring layer's positions lie at slots p % slots: the new keys
        and values are written there, and the visible ones gathered from there in order."""
        n_new, n_heads = q.shape[:2]
        end = start + n_new
        state, layer_keys, layer_values = cache.layers[layer], cache.keys[layer], cache.values[layer]
        if not isinstance(state, AttentionState) or layer_keys is None or layer_values is None:
            raise ValueError(f"layer {layer} keeps a recurrent state, not keys and values")
        first = 0 if settings.window is None else max(0, start - settings.window + 1)
        where: slice | np.ndarray = slice(start, end)
        visible: slice | np.ndarray = slice(first, end)
        if state.ring:
            if not settings.causal:
                raise ValueError(f"layer {layer}'s bidirectional attention cannot run over a ring")
            if settings.window is None or settings.window + n_new - 1 > state.slots:
                raise ValueError(
                    f"a pass of {n_new} tokens over a window of {settings.window} does not fit layer {layer}'s "
                    f"ring of {state.slots} slots: split it"
                )
            where, visible = np.arange(start, end) % state.slots, np.arange(first, end) % state.slots
        layer_keys[:, where] = encode_rows(state.kv_type, k.transpose(1, 0, 2))  # (Hkv, T, Dh) as stored
        layer_values[:, where] = encode_rows(state.kv_type, v.transpose(1, 0, 2))  # (Hkv, T, Dv) as stored
        keys = decode_rows(layer_keys[:, visible])  # (Hkv, S, Dh)
        values = decode_rows(layer_values[:, visible])  # (Hkv, S, Dv)
        key_pos = np.arange(first, end)
        rows = max(1, _SCORE_FLOATS // (n_heads * len(key_pos)))  # queries whose scores fit the budget at once
        parts = [
            self._attend_rows(q[lo : lo + rows], keys, values, start + lo, key_pos, settings)
            for lo in range(0, n_new, rows)
        ]
        return parts[0] if len(parts) == 1 else np.concatenate(parts)  # (T, H * Dv)

    @staticmethod
    def _attend_rows(
        q: np.ndarray, keys: np.ndarray, values: np.ndarray, start: int, key_pos: np.ndarray, settings: LayerAttention
    ) -> np.ndarray:
        """Queries q (T, H, Dh) at positions start .. start+T-1 over `keys` (Hkv, S, Dh) and
        `values` (Hkv, S, Dv) at positions `key_pos` (S,): (T, H * Dv)."""
        n_new, n_heads, head_dim = q.shape
        n_kv_heads = keys.shape[0]
        group = n_heads // n_kv_heads
        # (T, H, Dh) -> (Hkv, group * T, Dh): the queries that share one KV head, stacked
        grouped: np.ndarray = q.reshape(n_new, n_kv_heads, group, head_dim).transpose(1, 2, 0, 3)
        grouped = grouped.reshape(n_kv_heads, group * n_new, head_dim)
        scores = (grouped @ keys.transpose(0, 2, 1)) * np.float32(settings.scale)  # (Hkv, group*T, S)
        if settings.softcap is not None:
            scores = np.float32(settings.softcap) * np.tanh(scores / np.float32(settings.softcap))

        query_pos = np.arange(start, start + n_new)[:, None]  # (T, 1)
        # causal: the keys up to the query's position; else every key (key_pos ends at the pass's end)
        causal = key_pos[None, :] <= query_pos  # (T, S)
        allowed = causal if settings.causal else np.ones_like(causal)
        if settings.window is not None:
            allowed &= key_pos[None, :] > query_pos - settings.window
            if not settings.causal:
                allowed &= key_pos[None, :] < query_pos + settings.window
        scores = scores.reshape(n_kv_heads, group, n_new, -1)  # (Hkv, group, T, S)
        scores = np.where(allowed, scores, np.float32(-np.inf))
        if settings.sinks is None:
            scores -= scores.max(axis=-1, keepdims=True)
            probs = np.exp(scores)
            probs /= probs.sum(axis=-1, keepdims=True)
        else:  # each head's sink joins the softmax as one more logit, with no value
            sinks = settings.sinks.astype(np.float32).reshape(n_kv_heads, group, 1, 1)  # (Hkv, group, 1, 1)
            top = np.maximum(scores.max(axis=-1, keepdims=True), sinks)
            probs = np.exp(scores - top)
            probs /= probs.sum(axis=-1, keepdims=True) + np.exp(sinks - top)

        out = probs.reshape(n_kv_heads, group * n_new, -1) @ values  # (Hkv, group*T, Dv)
        out = out.reshape(n_kv_heads, group, n_new, -1).transpose(2, 0, 1, 3)  # (T, Hkv, group, Dv)
        return out.reshape(n_new, -1)  # (T, H * Dv)

    def gated_activation(self, gate: np.ndarray, up: np.ndarray, kind: str) -> np.ndarray:
        if kind == "silu":
            sigmoid = np.float32(0.5) * (np.float32(1.0) + np.tanh(np.float32(0.5) * gate))
            return gate * sigmoid * up
        if kind == "gelu_tanh":
            # 0.5·g·(1 + tanh(√(2/π)·g·(1 + 0.044715·g²)))·up, in place: `gate ** 3` calls powf
            # per element and alone cost more than the rest of a Gemma prefill.
            out = gate * gate
            out *= np.float32(0.044715)
            out += np.float32(1.0)
            out *= gate
            out *= np.float32(np.sqrt(2.0 / np.pi))
            np.tanh(out, out=out)
            out += np.float32(1.0)
            out *= gate
            out *= np.float32(0.5)
            out *= up
            return out
        if kind == "sigmoid":  # Qwen3.5's output gates; gate (T, 1) gates whole rows
            return up / (np.float32(1.0) + np.exp(-gate))
        if kind == "swiglu_oai":  # gpt-oss: clamped, sigmoid(1.702 g), and up + 1
            g = np.minimum(gate, np.float32(SWIGLU_LIMIT))
            u = np.clip(up, np.float32(-SWIGLU_LIMIT), np.float32(SWIGLU_LIMIT))
            return g / (np.float32(1.0) + np.exp(-np.float32(SWIGLU_ALPHA) * g)) * (u + np.float32(1.0))
        raise ValueError(f"unknown activation {kind!r}")

    def activation(self, x: np.ndarray, kind: str) -> np.ndarray:
        if kind == "swiglu_oai":
            raise ValueError("swiglu_oai needs a gate and an up projection")
        return self.gated_activation(x, np.ones_like(x), kind)

    def scale(self, x: np.ndarray, factor: float) -> np.ndarray:
        return x * np.float32(factor)

    def route(self, logits: np.ndarray, routing: Routing) -> np.ndarray:
        logits = np.asarray(logits, dtype=np.float32)  # (T, E)
        k = routing.n_used
        chosen = np.argsort(-logits, axis=-1, kind="stable")[:, :k]  # (T, k): falling, ties to the lower number
        picked = np.take_along_axis(logits, chosen, axis=-1)  # (T, k)
        if routing.order == "top_k_softmax":
            weights = np.exp(picked - picked[:, :1])
            weights /= weights.sum(axis=-1, keepdims=True)
        elif routing.order == "softmax_top_k":
            shifted = np.exp(logits - logits.max(axis=-1, keepdims=True))  # (T, E)
            weights = np.take_along_axis(shifted, chosen, axis=-1) / shifted.sum(axis=-1, keepdims=True)
            if routing.normalize:
                weights /= weights.sum(axis=-1, keepdims=True)
        else:
            raise ValueError(f"unknown routing order {routing.order!r}")
        if routing.expert_scale is not None:
            weights = weights * routing.expert_scale[chosen]
        return np.concatenate([chosen.astype(np.float32), weights.astype(np.float32)], axis=-1)  # (T, 2k)

    def experts(self, x: np.ndarray, choice: np.ndarray, weights: ExpertWeights, activation: str) -> np.ndarray:
        """As the contract says: the tokens that chose an expert go through it together."""
        k = choice.shape[1] // 2
        chosen, share = choice[:, :k].astype(np.int64), choice[:, k:]  # (T, k) each
        out = np.zeros(x.shape, dtype=np.float32)  # (T, D)
        for expert in np.unique(chosen):
            rows, slot = np.nonzero(chosen == expert)  # the tokens that chose it, and where
            h = x[rows]  # (n, D)
            gate = weights.gate.expert(expert).matmul_transposed(h)  # (n, F)
            up = weights.up.expert(expert).matmul_transposed(h)  # (n, F)
            if weights.gate_bias is not None:
                gate += weights.gate_bias[expert]
                up += weights.up_bias[expert]
            y = weights.down.expert(expert).matmul_transposed(self.gated_activation(gate, up, activation))  # (n, D)
            if weights.down_bias is not None:
                y += weights.down_bias[expert]
            np.add.at(out, rows, y * share[rows, slot][:, None])
        return out

    def add(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return a + b

    def softcap(self, x: np.ndarray, cap: float) -> np.ndarray:
        return np.float32(cap) * np.tanh(x / np.float32(cap))

    def to_host(self, x: np.ndarray) -> np.ndarray:
        return np.asarray(x, dtype=np.float32)

    def allocate_state(self, layers: list[LayerState]) -> NumpyState:
        return NumpyState(layers)

    def state_bytes(self, state: NumpyState) -> int:
        arrays = [a for a in state.keys + state.values if a is not None]
        return sum(a.nbytes for a in arrays) + sum(a.nbytes for layer in state.arrays for a in layer)

    def forget(self, state: NumpyState, start: int, end: int) -> None:
        """Zero positions start .. end-1 of every attention layer (a ring's at slots p % slots);
        from `start` 0, recurrent layers' arrays too (a fresh sequence). Otherwise recurrent
        layers are left as they are: forgetting positions of them is the engine's business
        (see the contract)."""
        for layer, keys, values, arrays in zip(state.layers, state.keys, state.values, state.arrays, strict=True):
            if not isinstance(layer, AttentionState) or keys is None or values is None:
                for array in arrays if start == 0 else ():
                    array[:] = 0.0
                continue
            rows = np.arange(start, end) % layer.slots if layer.ring else slice(start, end)
            keys[:, rows] = np.zeros((), keys.dtype)  # (Hkv, end - start, Dh or its Q8_0 blocks)
            values[:, rows] = np.zeros((), values.dtype)  # (Hkv, end - start, Dv or its Q8_0 blocks)

    def close(self) -> None:
        self.cache.clear()
