"""The MLX backend: Apple silicon's GPU through Metal, or the CPU where MLX has no GPU (Linux).

Weights. At load time every matrix whose GGUF blocks have an exact form in MLX's affine
quantized format (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q1_0; see
`backends.mlx_quantize`) is repacked into it, multiplied with `mx.quantized_matmul`, and
its embedding rows are gathered packed and dequantized. F32 matrices stay float32 (exact,
and no larger than in the file); every other one (F16, BF16, Q6_K, Q2_K, Q3_K, the IQ
and ternary types) becomes float16, converted a slice of rows at a time. Norms and biases
are float32.

Precision. Activations, the KV cache and the quantized weights' scales and biases are
float32, on Metal too:
- float32 keeps every scale and bias exact (in float16 the K-quants' d * sc products
  round); it costs one bit per weight more than float16 scales (6 instead of 5 bits per
  weight for 4-bit codes in groups of 32), which a bandwidth-bound decode pays;
- Gemma 3's residual stream leaves float16's range (|x| reaches 1.04e5 in the bundled
  Gemma-3-270M; float16 stops at 65504), and bfloat16 would round the formats' fp16 scales.
MLX requires a quantized matrix's scales to have its input's dtype (it would otherwise cast
them on every call), which ties the two choices together. Float16 matrices multiply float16
copies of their inputs (casting the matrix instead would copy it on every call); the
inputs are post-norm activations, a few hundred at most in the bundled models.

Fast paths: `mx.fast.rms_norm`, `mx.fast.rope` and `mx.fast.scaled_dot_product_attention`
(sliding windows as a mask); only soft-capped attention (Gemma 2), which the fast kernel
cannot express, is written out.

Decoding. The backend's runner (`CompiledStepRunner`) turns a one-token pass into one
`mx.compile`d function per state whose work is queued with `mx.async_eval` and not
awaited; `argmax` keeps a greedy token on the device (`device_tokens`) so that the next
step can be queued before the token is read back.
"""

import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import numpy as np
from gguf import GGMLQuantizationType

from backends.base import (
    AttentionState,
    Backend,
    DeltaNetLayer,
    ExpertWeights,
    Forward,
    LayerAttention,
    LayerState,
    PassInput,
    RecurrentState,
    Routing,
    Runner,
    Segment,
    WeightSpec,
)
from backends.delta_rule import row_groups
from backends.dequant import dequantize, dequantize_rows
from backends.mlx_quantize import affine_layout, mxfp4_codes, to_affine

ACTIVATIONS = mx.float32  # activations, KV cache, norms, scales and biases; F32 matrices
SWIGLU_ALPHA, SWIGLU_LIMIT = 1.702, 7.0  # gpt-oss's clamped SwiGLU ("swiglu_oai")
SPAN_BUCKET = 256  # a compiled decode step reads the cache in multiples of this many positions
_HALF_CHUNK_WEIGHTS = 1 << 24  # float32 weights dequantized at once while converting to float16


@dataclass(frozen=True)
class QuantizedMatrix:
    """A matrix in MLX's affine format: packed codes, per-group scales and biases."""

    packed: mx.array  # (out, in * bits / 32) uint32
    scales: mx.array  # (out, in / group_size) float32
    biases: mx.array
    group_size: int
    bits: int

    def rows(self, ids: mx.array) -> mx.array:
        """Rows `ids`, dequantized: (len(ids), in) float32."""
        return mx.dequantize(
            self.packed[ids], self.scales[ids], self.biases[ids], group_size=self.group_size, bits=self.bits
        )

    def times_transposed(self, x: mx.array) -> mx.array:
        """x (T, in) @ W.T: (T, out)."""
        return mx.quantized_matmul(
            x, self.packed, self.scales, self.biases, transpose=True, group_size=self.group_size, bits=self.bits
        )


@dataclass(frozen=True)
class DenseMatrix:
    """A matrix held as plain floats: float32 (from F32) or float16."""

    values: mx.array  # (out, in)

    def rows(self, ids: mx.array) -> mx.array:
        """Rows `ids`: (len(ids), in) float32."""
        return self.values[ids].astype(ACTIVATIONS)

    def times_transposed(self, x: mx.array) -> mx.array:
        """x (T, in) @ W.T in the matrix's dtype, returned as float32: (T, out)."""
        return (x.astype(self.values.dtype) @ self.values.T).astype(ACTIVATIONS)


@dataclass(frozen=True)
class ExpertStack:
    """A mixture-of-experts layer's matrices (E, out, in): MLX's affine or MXFP4 codes where
    the GGUF type has an exact form (`scales`, and `biases` for affine), float16 otherwise
    (float32 for F32 files, and on the CPU, where MLX's gathered product takes float32 only)."""

    values: mx.array  # (E, out, in * bits / 32) uint32 codes, or (E, out, in) float16
    scales: mx.array | None = None
    biases: mx.array | None = None
    group_size: int = 32
    bits: int = 4
    mode: str = "affine"

    def gathered(self, x: mx.array, chosen: mx.array) -> mx.array:
        """x (T, k or 1, 1, in) times each token's chosen experts transposed: (T, k, 1, out)."""
        if self.scales is None:
            return mx.gather_mm(x.astype(self.values.dtype), self.values.swapaxes(-1, -2), rhs_indices=chosen).astype(
                ACTIVATIONS
            )
        return mx.gather_qmm(
            x,
            self.values,
            self.scales,
            self.biases,
            rhs_indices=chosen,
            transpose=True,
            group_size=self.group_size,
            bits=self.bits,
            mode=self.mode,
        )


class MLXState:
    """One sequence's per-layer state: `arrays[i]` holds attention layer i's keys
    (1, Hkv, slots, Dh) and values (1, Hkv, slots, Dv), float16 or float32 as the layer's KV
    type says (`MLXBackend.kv_types`), or a recurrent layer's float32 arrays.

    A full layer holds position p at slot p. A windowed ring holds it at slot p % slots and
    attends over every slot, masked by the position each slot holds (`_ring_mask`): the
    compiled step then needs no position-dependent slicing.
    The arrays are evaluated here: since MLX 0.31.2 an unevaluated array can only be
    evaluated by the thread that made it, and generation runs on a worker thread.
    `decode_step` holds the compiled decode step for this state (see `CompiledStepRunner`).
    """

    def __init__(self, layers: list[LayerState]):
        self.layers = tuple(layers)
        self.arrays: list[list[mx.array]] = []
        for layer in self.layers:
            if isinstance(layer, AttentionState):
                dims = (layer.head_dim, layer.value_dim)
                stored = mx.float16 if layer.kv_type == "f16" else ACTIVATIONS
                self.arrays.append([mx.zeros((1, layer.kv_heads, layer.slots, d), dtype=stored) for d in dims])
            else:
                self.arrays.append([mx.zeros(shape, dtype=ACTIVATIONS) for shape in layer.shapes])
        mx.eval(self.arrays)
        # the context: what a compiled step's span may reach (the full layers' slots)
        full = [layer.slots for layer in self.layers if isinstance(layer, AttentionState) and not layer.ring]
        self.n_ctx = max(full, default=0)
        self.decode_step: Callable[[Any, int], mx.array] | None = None
        self.decode_generation = 0  # the runner generation its decode_step was traced in

    @property
    def state(self) -> list[list[mx.array]]:
        """The arrays a compiled step reads and replaces."""
        return self.arrays


@dataclass(frozen=True)
class StepStart:
    """`start` as a compiled decode step sees it.

    `position` is the new token's position, a (1,) int32 device array, so that one trace
    serves every position; `span` is how many cache positions from 0 the step may read, a
    trace-time constant (a multiple of SPAN_BUCKET, or the context length).
    """

    position: mx.array
    span: int


def _delta_step(q, k, v, g, b, memory: mx.array) -> tuple[mx.array, mx.array]:
    """The delta rule for one row: q, k, v (1, Hv, Dh), g and b (1, Hv), memory (Hv, Dh, Dh).
    Returns the output (1, Hv, Dh) and the new memory."""
    memory = memory * mx.exp(g[0])[:, None, None]
    delta = (v[0] - (k[0][:, :, None] * memory).sum(axis=1)) * b[0][:, None]  # (Hv, Dh)
    memory = memory + k[0][:, :, None] * delta[:, None, :]
    return (q[0][:, :, None] * memory).sum(axis=1)[None], memory


def _delta_chunks(q, k, v, g, b, memory: mx.array, chunk: int) -> tuple[mx.array, mx.array]:
    """The delta rule over T rows in chunks of `chunk` (transformers' chunked form, as
    `delta_rule.chunked`); the triangular solve runs on the CPU stream, where MLX has it.
    Returns the output (T, Hv, Dh) and the new memory."""
    outs = []
    for lo in range(0, q.shape[0], chunk):
        qc, kc, vc = (y[lo : lo + chunk].transpose(1, 0, 2) for y in (q, k, v))  # (Hv, L, Dh)
        n = qc.shape[1]
        cum = mx.cumsum(g[lo : lo + chunk].T, axis=1)  # (Hv, L): log decay from the chunk's start
        bc = b[lo : lo + chunk].T[:, :, None]  # (Hv, L, 1)
        lower = mx.tril(mx.ones((n, n), dtype=mx.bool_))
        decay = mx.exp(mx.where(lower, cum[:, :, None] - cum[:, None, :], -mx.inf))  # (Hv, L, L)
        eye = mx.eye(n, dtype=q.dtype)
        system = (kc * bc) @ kc.transpose(0, 2, 1) * decay * (1 - eye) + eye  # unit lower triangular
        rhs = bc * (vc - mx.exp(cum)[:, :, None] * (kc @ memory))  # (Hv, L, Dh)
        v_new = mx.linalg.solve_triangular(system, rhs, upper=False, stream=mx.cpu)  # (Hv, L, Dh)
        intra = (qc @ kc.transpose(0, 2, 1)) * decay  # (Hv, L, L)
        outs.append(((qc * mx.exp(cum)[:, :, None]) @ memory + intra @ v_new).transpose(1, 0, 2))  # (L, Hv, Dh)
        tail = mx.exp(cum[:, -1:] - cum)[:, :, None]  # (Hv, L, 1): decay from each row to the end
        memory = memory * mx.exp(cum[:, -1])[:, None, None] + (kc * tail).transpose(0, 2, 1) @ v_new
    return mx.concatenate(outs), memory


class MLXBackend(Backend):
    """Runs the op set with MLX on its default device: the GPU on Apple silicon."""

    name = "mlx"
    device_tokens = True  # greedy tokens stay on the device (`argmax`) and feed the next step
    batched_decode = False  # fast RoPE counts on from one position: concurrent sequences step in turn
    # mlx's 8-bit quantization is affine (a scale and a bias per group), not Q8_0's symmetric
    # blocks, so it would not store the reference's values: Q8_0 is asked for, float16 is kept
    kv_types = ("f16", "f32")

    def __init__(self):
        self.one_bit = _has_one_bit_kernels()
        self.decode_traces = 0  # how often a decode step was traced (compiled), for tests and tuning

    @property
    def device_name(self) -> str:
        if mx.default_device().type == mx.gpu:
            return "Apple GPU (Metal, MLX float32)"
        return f"CPU ({os.cpu_count()} cores, MLX float32)"

    # -- weights -------------------------------------------------------------------

    def prepare_weight(self, spec: WeightSpec) -> mx.array | QuantizedMatrix | DenseMatrix | ExpertStack:
        if len(spec.shape) == 1 or spec.name.endswith(".bias"):  # norms and biases (experts': (E, F))
            return mx.array(dequantize(spec.raw, spec.ggml_type, spec.shape))
        if len(spec.shape) == 3:
            return _expert_stack(spec, self.one_bit)
        if spec.ggml_type == GGMLQuantizationType.F32:
            return DenseMatrix(mx.array(dequantize(spec.raw, spec.ggml_type, spec.shape)))
        if affine_layout(spec.ggml_type) is not None:
            m = to_affine(spec.raw, spec.ggml_type, spec.shape, self.one_bit)
            return QuantizedMatrix(mx.array(m.packed), mx.array(m.scales), mx.array(m.biases), m.group_size, m.bits)
        return DenseMatrix(mx.array(_float16_rows(spec)))

    # -- ops -------------------------------------------------------------------------

    def embedding(self, weight: QuantizedMatrix | DenseMatrix, token_ids: Any, scale: float = 1.0) -> mx.array:
        rows = weight.rows(_token_array(token_ids))  # (T, D)
        return rows * scale if scale != 1.0 else rows

    def linear(self, x: mx.array, weight: QuantizedMatrix | DenseMatrix, bias: mx.array | None = None) -> mx.array:
        out = weight.times_transposed(x)
        return out + bias if bias is not None else out

    def rms_norm(self, x: mx.array, weight: mx.array, eps: float) -> mx.array:
        return mx.fast.rms_norm(x, weight, eps)

    def rope(
        self,
        x: mx.array,
        positions: Any,
        base: float,
        rope_dim: int,
        neox: bool,
        freq_factors: np.ndarray | None = None,
        mscale: float = 1.0,
    ) -> mx.array:
        """As the contract says, for consecutive positions (all the transformer passes):
        MLX's fast RoPE takes the first position and counts on from it."""
        frequencies: dict[str, Any]
        if freq_factors is None:
            frequencies = {"base": base, "freqs": None}
        else:  # mx.fast.rope divides positions by `freqs`: the inverse frequencies' inverses
            periods = base ** (np.arange(0, rope_dim, 2, dtype=np.float64) / rope_dim) * freq_factors
            frequencies = {"base": None, "freqs": mx.array(periods.astype(np.float32))}
        heads = x.transpose(1, 0, 2)  # (heads, T, Dh): fast RoPE counts positions along axis -2
        out = mx.fast.rope(
            heads, rope_dim, traditional=not neox, scale=1.0, offset=_first_position(positions), **frequencies
        )
        if mscale != 1.0:  # the rotated features only
            out = mx.concatenate([out[..., :rope_dim] * mscale, out[..., rope_dim:]], axis=-1)
        return out.transpose(1, 0, 2)  # (T, heads, Dh)

    def attention(
        self,
        q: mx.array,
        k: mx.array,
        v: mx.array,
        cache: MLXState,
        layer: int,
        start: int | StepStart,
        settings: LayerAttention,
    ) -> mx.array:
        """As the contract says; `start` may also be a compiled step's StepStart."""
        n_new = q.shape[0]
        state, arrays = cache.layers[layer], cache.arrays[layer]
        if not isinstance(state, AttentionState):
            raise ValueError(f"layer {layer} keeps a recurrent state, not keys and values")
        at = start.position if isinstance(start, StepStart) else mx.array([start], dtype=mx.int32)
        stored = arrays[0].dtype  # float16 rounds to nearest even, as the NumPy reference does
        new_keys = k.transpose(1, 0, 2)[None].astype(stored)  # (1, Hkv, T, Dh)
        new_values = v.transpose(1, 0, 2)[None].astype(stored)  # (1, Hkv, T, Dv)
        if state.ring:
            if not settings.causal:
                raise ValueError(f"layer {layer}'s bidirectional attention cannot run over a ring")
            if settings.window is None or settings.window + n_new - 1 > state.slots:
                raise ValueError(
                    f"a pass of {n_new} tokens over a window of {settings.window} does not fit layer {layer}'s "
                    f"ring of {state.slots} slots: split it"
                )
            where = (at + mx.arange(n_new)) % state.slots  # (T,) slots
            arrays[0][:, :, where] = new_keys
            arrays[1][:, :, where] = new_values
            keys, values = arrays  # every slot: (1, Hkv, slots, D)
            mask = _ring_mask(at, n_new, state.slots, settings.window)
        else:
            arrays[0] = mx.slice_update(arrays[0], new_keys, at, axes=(2,))
            arrays[1] = mx.slice_update(arrays[1], new_values, at, axes=(2,))
            first, length, mask = _visible(start, n_new, settings.window, settings.causal)
            keys = _positions(arrays[0], first, length)  # (1, Hkv, S, Dh)
            values = _positions(arrays[1], first, length)  # (1, Hkv, S, Dv)
        keys, values = keys.astype(ACTIVATIONS), values.astype(ACTIVATIONS)  # the visible ones, exact
        queries = q.transpose(1, 0, 2)[None]  # (1, H, T, Dh)
        if settings.softcap is None:
            sinks = None if settings.sinks is None else mx.array(settings.sinks, dtype=ACTIVATIONS)  # (H,)
            out = mx.fast.scaled_dot_product_attention(
                queries, keys, values, scale=settings.scale, mask=mask, sinks=sinks
            )
        else:
            out = _softcapped_attention(queries, keys, values, settings.scale, settings.softcap, mask)
        return out[0].transpose(1, 0, 2).reshape(n_new, -1)  # (1, H, T, Dv) -> (T, H * Dv)

    def layer_norm(self, x: mx.array, weight: mx.array, bias: mx.array | None, eps: float) -> mx.array:
        return mx.fast.layer_norm(x, weight, bias, eps)

    def activation(self, x: mx.array, kind: str) -> mx.array:
        if kind == "swiglu_oai":
            raise ValueError("swiglu_oai needs a gate and an up projection")
        return self.gated_activation(x, mx.ones_like(x), kind)

    def scale(self, x: mx.array, factor: float) -> mx.array:
        return x * factor

    def gated_activation(self, gate: mx.array, up: mx.array, kind: str) -> mx.array:
        if kind == "silu":
            return gate * mx.sigmoid(gate) * up
        if kind == "sigmoid":
            return mx.sigmoid(gate) * up
        if kind == "gelu_tanh":
            inner = math.sqrt(2.0 / math.pi) * gate * (1.0 + 0.044715 * gate * gate)
            return 0.5 * gate * (1.0 + mx.tanh(inner)) * up
        if kind == "swiglu_oai":  # gpt-oss: clamped, sigmoid(1.702 g), and up + 1
            g = mx.minimum(gate, SWIGLU_LIMIT)
            return g * mx.sigmoid(SWIGLU_ALPHA * g) * (mx.clip(up, -SWIGLU_LIMIT, SWIGLU_LIMIT) + 1.0)
        raise ValueError(f"unknown activation {kind!r}")

    def route(self, logits: mx.array, routing: Routing) -> mx.array:
        """As the contract says; ties between equal logits are ordered as `mx.argsort` orders them."""
        k = routing.n_used
        chosen = mx.argsort(-logits, axis=-1)[:, :k]  # (T, k), falling
        picked = mx.take_along_axis(logits, chosen, axis=-1)  # (T, k)
        if routing.order == "top_k_softmax":
            weights = mx.softmax(picked, axis=-1, precise=True)
        elif routing.order == "softmax_top_k":
            weights = mx.take_along_axis(mx.softmax(logits, axis=-1, precise=True), chosen, axis=-1)
            if routing.normalize:
                weights = weights / weights.sum(axis=-1, keepdims=True)
        else:
            raise ValueError(f"unknown routing order {routing.order!r}")
        if routing.expert_scale is not None:
            weights = weights * mx.array(routing.expert_scale)[chosen]
        return mx.concatenate([chosen.astype(ACTIVATIONS), weights], axis=-1)  # (T, 2k)

    def experts(self, x: mx.array, choice: mx.array, weights: ExpertWeights, activation: str) -> mx.array:
        """As the contract says, with MLX's gathered products (`gather_qmm`, `gather_mm`)."""
        k = choice.shape[1] // 2
        chosen, share = choice[:, :k].astype(mx.uint32), choice[:, k:]  # (T, k) each
        rows = mx.expand_dims(x, (-2, -3))  # (T, 1, 1, D)
        gate = weights.gate.gathered(rows, chosen)  # (T, k, 1, F)
        up = weights.up.gathered(rows, chosen)
        if weights.gate_bias is not None:
            gate = gate + weights.gate_bias[chosen][:, :, None]  # (T, k, 1, F)
            up = up + weights.up_bias[chosen][:, :, None]
        out = weights.down.gathered(self.gated_activation(gate, up, activation), chosen)  # (T, k, 1, D)
        if weights.down_bias is not None:
            out = out + weights.down_bias[chosen][:, :, None]
        return (out[:, :, 0] * share[:, :, None]).sum(axis=1)  # (T, D)

    def add(self, a: mx.array, b: mx.array) -> mx.array:
        return a + b

    def softcap(self, x: mx.array, cap: float) -> mx.array:
        return cap * mx.tanh(x / cap)

    def to_host(self, x: mx.array) -> np.ndarray:
        return np.array(x.astype(mx.float32))

    # -- per-layer state -----------------------------------------------------------

    def allocate_state(self, layers: list[LayerState]) -> MLXState:
        return MLXState(layers)

    def state_bytes(self, state: MLXState) -> int:
        return sum(a.nbytes for layer in state.arrays for a in layer)

    def state_arrays(self, state: MLXState) -> list[np.ndarray]:
        """Host copies of every layer's arrays, layer by layer."""
        return [np.array(a) for layer in state.arrays for a in layer]

    def load_state_arrays(self, state: MLXState, arrays: list[np.ndarray]) -> None:
        """Replace every layer's arrays by `arrays` (as `state_arrays` orders them), on the device."""
        host = iter(arrays)
        state.arrays[:] = [[mx.array(next(host)) for _ in layer] for layer in state.arrays]
        mx.eval(state.arrays)

    def close(self) -> None:
        mx.clear_cache()

    # -- running passes ----------------------------------------------------------------

    def short_conv(self, x: mx.array, weight: np.ndarray, states: Sequence[Any], layer: int) -> mx.array:
        kernel = mx.array(weight, dtype=ACTIVATIONS)  # (C, K)
        outs = []
        for rows, state in zip(row_groups(x.shape[0], len(states)), states, strict=True):
            n = rows.stop - rows.start
            padded = mx.concatenate([state.arrays[layer][0], x[rows]])  # (K - 1 + T, C)
            out = padded[:n] * kernel[:, 0]  # (T, C)
            for j in range(1, kernel.shape[1]):
                out = out + padded[j : j + n] * kernel[:, j]
            state.arrays[layer][0] = padded[n:]
            outs.append(out * mx.sigmoid(out))
        return outs[0] if len(outs) == 1 else mx.concatenate(outs)

    def delta_net(
        self, x: mx.array, alpha: mx.array, beta: mx.array, settings: DeltaNetLayer, states: Sequence[Any], layer: int
    ) -> mx.array:
        """One row of a sequence steps (the compiled decode step), more go in chunks."""
        s, n = settings, x.shape[0]
        width, repeat = s.k_heads * s.head_dim, s.v_heads // s.k_heads

        def l2norm(y: mx.array) -> mx.array:
            return y * mx.rsqrt((y * y).sum(axis=-1, keepdims=True) + s.eps)

        q = mx.tile(l2norm(x[:, :width].reshape(n, s.k_heads, s.head_dim)), (1, repeat, 1))  # (T, Hv, Dh)
        q = q * s.head_dim**-0.5
        k = mx.tile(l2norm(x[:, width : 2 * width].reshape(n, s.k_heads, s.head_dim)), (1, repeat, 1))  # (T, Hv, Dh)
        v = x[:, 2 * width :].reshape(n, s.v_heads, s.head_dim)  # (T, Hv, Dh)
        g = mx.array(s.a) * mx.logaddexp(mx.zeros_like(alpha), alpha + mx.array(s.dt_bias))  # (T, Hv): log decay
        b = mx.sigmoid(beta)  # (T, Hv)
        outs = []
        for rows, state in zip(row_groups(n, len(states)), states, strict=True):
            part = (q[rows], k[rows], v[rows], g[rows], b[rows], state.arrays[layer][1])
            one_row = rows.stop - rows.start == 1
            out, state.arrays[layer][1] = _delta_step(*part) if one_row else _delta_chunks(*part, s.chunk)
            outs.append(out.reshape(rows.stop - rows.start, -1))  # (rows, Hv * Dh)
        return outs[0] if len(outs) == 1 else mx.concatenate(outs)

    def snapshot(self, state: Any) -> Any:
        """The recurrent layers' arrays as they are (MLX never changes an array in place)."""
        return [
            list(arrays) if isinstance(layer, RecurrentState) else None
            for layer, arrays in zip(state.layers, state.arrays, strict=True)
        ]

    def restore(self, state: Any, snapshot: Any) -> None:
        for arrays, saved in zip(state.arrays, snapshot, strict=True):
            if saved is not None:
                arrays[:] = saved

    def runner(self, forward: Forward) -> "CompiledStepRunner":
        """One-token steps compiled once per state; other passes op by op."""
        return CompiledStepRunner(self, forward)

    def argmax(self, logits: mx.array) -> mx.array:
        """The most likely token after the last position, (1,) int32, left on the device, queued."""
        token = mx.argmax(logits[-1], axis=-1, keepdims=True).astype(mx.int32)  # (1,)
        mx.async_eval(token)
        return token


class CompiledStepRunner(Runner):
    """The MLX backend's runner: a one-token pass on one state runs as one compiled function,
    queued (`mx.async_eval`) and not awaited; any other pass runs op by op."""

    def __init__(self, backend: MLXBackend, forward: Forward):
        super().__init__(forward)
        self.backend = backend
        self.generation = 0  # bumped by `reset`; a state's compiled step of an older one is traced again

    def reset(self) -> None:
        self.generation += 1

    def __call__(self, tokens: Any, segments: Sequence[Segment], all_logits: bool = False, hidden: bool = False) -> Any:
        if len(segments) == 1 and segments[0].length == 1 and not hidden:
            segment = segments[0]
            return self.step(segment.state)(tokens[0], segment.start)
        return super().__call__(tokens, segments, all_logits, hidden)

    def step(self, state: MLXState) -> Callable[[Any, int], mx.array]:
        """The compiled one-token step of `state`, made at its first use: step(token, start)
        takes the token as a host int or the device array `argmax` left, and returns the
        logits (1, vocab) without waiting for them.

        The position reaches the trace as a device array (slice updates and RoPE take array
        offsets) and the state through `mx.compile`'s captured state, so a trace serves
        every position of a bucket of SPAN_BUCKET: attention reads the cache up to the
        bucket's end, masking what lies past the token. Crossing into the next bucket
        traces once more; MLX keeps every trace.
        """
        if state.decode_step is None or state.decode_generation != self.generation:
            state.decode_generation = self.generation
            backend = self.backend

            def traced(token_ids: mx.array, position: mx.array, span: int) -> mx.array:
                backend.decode_traces += 1  # Python runs only while MLX traces
                segment = Segment(state, StepStart(position, span), 1)
                return self.forward(PassInput(token_ids, position, (segment,), all_logits=False))

            compiled = mx.compile(traced, inputs=state.state, outputs=state.state)

            def step(token: Any, start: int) -> mx.array:
                span = min(state.n_ctx, (start // SPAN_BUCKET + 1) * SPAN_BUCKET)
                logits = compiled(_token_array(token), mx.array([start], dtype=mx.int32), span)
                mx.async_eval(logits)
                return logits

            state.decode_step = step
        return state.decode_step


# -- helpers ----------------------------------------------------------------------------


def _has_one_bit_kernels() -> bool:
    """Whether this MLX build multiplies 1-bit affine codes on its default device."""
    try:
        x = mx.ones((1, 128))
        codes = mx.zeros((1, 128 // 32), dtype=mx.uint32)
        mx.eval(mx.quantized_matmul(x, codes, mx.ones((1, 1)), mx.zeros((1, 1)), group_size=128, bits=1))
    except (ValueError, RuntimeError):
        return False
    return True


def _expert_stack(spec: WeightSpec, one_bit: bool) -> ExpertStack:
    """A 3-D stack of expert matrices in MLX's form: affine codes, MXFP4 codes, or float16."""
    n_experts, n_out, n_in = spec.shape
    flat = (n_experts * n_out, n_in)  # one matrix of every expert's rows
    if spec.ggml_type == GGMLQuantizationType.MXFP4:
        codes, exponents = mxfp4_codes(spec.raw, flat)
        return ExpertStack(
            mx.array(codes.reshape(n_experts, n_out, -1)),
            mx.array(exponents.reshape(n_experts, n_out, -1)),
            mode="mxfp4",
        )
    if affine_layout(spec.ggml_type, one_bit) is not None:
        m = to_affine(spec.raw, spec.ggml_type, flat, one_bit)
        packed, scales, biases = (mx.array(a.reshape(n_experts, n_out, -1)) for a in (m.packed, m.scales, m.biases))
        return ExpertStack(packed, scales, biases, group_size=m.group_size, bits=m.bits)
    if spec.ggml_type == GGMLQuantizationType.F32 or mx.default_device().type != mx.gpu:  # MLX's CPU gather_mm: float32
        dense = dequantize(spec.raw, spec.ggml_type, spec.shape)
    else:
        dense = _float16_rows(WeightSpec(spec.name, spec.raw, spec.ggml_type, flat))
    return ExpertStack(mx.array(dense.reshape(n_experts, n_out, n_in)))


def _float16_rows(spec: WeightSpec) -> np.ndarray:
    """A matrix dequantized to float16, through float32 a slice of rows at a time."""
    n_rows, n_cols = spec.shape
    out = np.empty((n_rows, n_cols), dtype=np.float16)
    step = max(1, _HALF_CHUNK_WEIGHTS // n_cols)
    for lo in range(0, n_rows, step):
        out[lo : lo + step] = dequantize_rows(spec.raw, spec.ggml_type, spec.shape, slice(lo, lo + step))
    return out


def _token_array(token_ids: Any) -> mx.array:
    """Token ids as a device int32 array: (T,)."""
    if isinstance(token_ids, mx.array):
        return token_ids
    return mx.array(np.asarray(token_ids, dtype=np.int32).reshape(-1))


def _first_position(positions: Any) -> int | mx.array:
    """The first of consecutive positions: a host int, or a (1,)-array's element in a trace."""
    if isinstance(positions, mx.array):
        return positions[0]
    positions = np.asarray(positions)
    if np.any(np.diff(positions) != 1):
        raise ValueError("the MLX backend rotates consecutive positions only")
    return int(positions[0])


def _visible(start: int | StepStart, n_new: int, window: int | None, causal: bool = True) -> tuple[Any, int, Any]:
    """Which cache positions the queries at start .. start + n_new - 1 read.

    Returns (first, length, mask): positions first .. first + length - 1, and the mask for
    the fast attention kernel (None, "causal" or a boolean (T, S) array). A compiled step
    reads a fixed span and masks by position; a host `start` reads exactly what is visible.
    Not `causal`, every query sees the whole pass too (a compiled step, of one token, sees
    the same either way).
    """
    first: int | mx.array
    if isinstance(start, StepStart):
        length, first = start.span, 0
        if window is not None and window + n_new - 1 < length:  # only the window's positions
            length = window + n_new - 1
            first = mx.maximum(start.position + n_new - length, 0)
        return first, length, _mask(start.position, n_new, first, length, window)
    first = 0 if window is None else max(0, start - window + 1)
    length = start + n_new - first
    if n_new == 1 or (window is None and not causal):
        return first, length, None
    if window is None:
        return first, length, "causal"  # lower-right aligned: the last query sees the last key
    return first, length, _mask(start, n_new, first, length, window, causal)


def _mask(start: Any, n_new: int, first: Any, length: int, window: int | None, causal: bool = True) -> mx.array:
    """Which keys each query may see, causally (or not) and within the window: (T, S) bool."""
    query = start + mx.arange(n_new)[:, None]  # (T, 1) positions
    key = first + mx.arange(length)[None, :]  # (1, S) positions
    allowed = key <= (query if causal else start + n_new - 1)
    if window is not None:
        allowed = allowed & (key > query - window)
        if not causal:
            allowed = allowed & (key < query + window)
    return allowed


def _ring_mask(start: mx.array, n_new: int, slots: int, window: int) -> mx.array:
    """Which slots of a ring each query at start .. start + n_new - 1 may see: (T, slots) bool.

    After the pass, slot s holds the last position written there, last - ((last - s) mod
    slots) for last = start + n_new - 1 (negative: never written)."""
    last = start + n_new - 1
    key = last - (last - mx.arange(slots)) % slots  # (slots,) positions
    query = start + mx.arange(n_new)[:, None]  # (T, 1) positions
    return (key >= 0) & (key <= query) & (key > query - window)


def _positions(storage: mx.array, first: Any, length: int) -> mx.array:
    """Positions first .. first + length - 1 of a layer's keys or values: (1, Hkv, S, D)."""
    if isinstance(first, int):
        return storage[:, :, first : first + length]
    batch, heads, _, dim = storage.shape
    return mx.slice(storage, first, axes=(2,), slice_size=(batch, heads, length, dim))


def _softcapped_attention(q: mx.array, k: mx.array, v: mx.array, scale: float, cap: float, mask: Any) -> mx.array:
    """Attention with scores soft-capped before the softmax, which the fast kernel cannot do.

    q (1, H, T, Dh), k (1, Hkv, S, Dh), v (1, Hkv, S, Dv) -> (1, H, T, Dv).
    """
    _, n_heads, n_new, head_dim = q.shape
    n_kv_heads, n_keys = k.shape[1], k.shape[2]
    if isinstance(mask, str):  # "causal", lower-right aligned
        mask = mx.arange(n_keys)[None, :] <= mx.arange(n_keys - n_new, n_keys)[:, None]  # (T, S)
    grouped = q.reshape(n_kv_heads, n_heads // n_kv_heads, n_new, head_dim)  # (Hkv, group, T, Dh)
    scores = (grouped * scale) @ k[0][:, None].swapaxes(-1, -2)  # (Hkv, group, T, S)
    scores = cap * mx.tanh(scores / cap)
    if mask is not None:
        scores = mx.where(mask, scores, -math.inf)
    out = mx.softmax(scores, axis=-1, precise=True) @ v[0][:, None]  # (Hkv, group, T, Dv)
    return out.reshape(1, n_heads, n_new, -1)  # (1, H, T, Dv)
