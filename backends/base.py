"""The contract every compute backend implements.

The transformer is written once, in `engine/models/`, against the small op set below.
A backend owns its tensors (NumPy arrays, MLX arrays, device buffers): the engine only
passes them from one op to the next and reads logits back with `to_host`.

Shapes use these letters:
    T   tokens in the current step (prefill chunk length, or 1 when decoding)
    D   model width (embedding length)
    H   query heads;  Hkv  key/value heads (H is a multiple of Hkv)
    Dh  head dimension of queries and keys;  Dv  head dimension of values
    N   positions a layer's keys and values are kept for (the context, or a window's ring)
Activations are float32 unless a backend documents otherwise; the NumPy backend is the
reference, and every other backend must match its numbers within the tolerance its tests
state.

A model's forward passes go through one door, the backend's `runner`: a `Runner` takes
new tokens and the sequences they continue (`Segment`s) and returns logits. The default
runs the op set one op at a time, as the model's forward function calls it; a backend may
instead replay a recorded pass (cpu: one C call per pass) or a compiled one (MLX), with the
same numbers. `argmax` and `device_tokens` let greedy decoding keep tokens on a device.
"""

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from backends.errors import BackendError
from backends.kv_types import KV_TYPES, check_kv_type, kv_row_bytes
from backends.memory import MAPPED_WEIGHTS, MemoryRule

Tensor = Any
"""A backend-owned activation. Only the backend that made it may read it."""


@dataclass(frozen=True)
class WeightSpec:
    """A weight tensor as it lies in the model file.

    `raw` is a read-only uint8 view of its GGUF blocks (normally a slice of a memory map),
    `ggml_type` the GGML type number and `shape` the NumPy-order shape: a matrix is
    (out_features, in_features), rows are contiguous in the file.
    """

    name: str
    raw: np.ndarray
    ggml_type: int
    shape: tuple[int, ...]


@dataclass(frozen=True)
class LayerAttention:
    """Per-layer attention settings the attention op needs.

    `window` limits each query to the last `window` positions (sliding-window layers);
    None attends to everything before it. `softcap`, when set, applies
    `softcap * tanh(score / softcap)` to the scores before the softmax. `sinks` (H,)
    float32, when set, are a learned logit per query head that joins each row's softmax
    and takes its share of the weight without a value (gpt-oss's attention sinks):
    p_j = exp(s_j) / (sum_i exp(s_i) + exp(sink_h)).

    `causal` False (an embedding model's bidirectional attention: EmbeddingGemma, BERT): each
    query attends to every position of its sequence written so far, its pass's later ones
    included, and `window` is symmetric: positions less than `window` away on either side.
    Such a layer keeps every position (no ring), and its text goes in one pass.
    """

    scale: float
    window: int | None = None
    softcap: float | None = None
    sinks: np.ndarray | None = None
    causal: bool = True


@dataclass(frozen=True)
class Routing:
    """How a mixture-of-experts layer picks each token's experts from its router logits
    (one logit per expert).

    `order` "softmax_top_k" (Qwen3-MoE): a softmax over all `n_experts` logits, then the
    `n_used` largest probabilities, divided by their sum where `normalize` is set.
    "top_k_softmax" (gpt-oss): the `n_used` largest logits, then a softmax over those.
    Ties go to the lower expert number; the chosen experts are in falling order of weight.
    `expert_scale` (n_experts,) float32, when set, multiplies each chosen expert's weight last
    (Gemma 4's per-expert scale).
    """

    n_experts: int
    n_used: int
    order: str = "softmax_top_k"
    normalize: bool = True
    expert_scale: np.ndarray | None = field(default=None, compare=False)


@dataclass(frozen=True)
class ExpertWeights:
    """A mixture-of-experts layer's experts, as the backend prepared them from 3-D GGUF
    tensors: `gate` and `up` (E, F, D), `down` (E, D, F), each expert's matrix contiguous;
    and their optional biases (E, F), (E, F), (E, D), float32. The tensors may have
    different types (a dynamic quant keeps `down` in a higher one)."""

    gate: Any
    up: Any
    down: Any
    gate_bias: Any = None
    up_bias: Any = None
    down_bias: Any = None


@dataclass(frozen=True)
class AttentionState:
    """A layer's keys and values: `kv_heads` heads of `head_dim` (keys) and `value_dim`
    (values) at `slots` positions.

    With `window` None the layer attends to everything before a query: `slots` is the
    context length and position p lies at slot p. With a window (sliding-window layers)
    the layer keeps only what its queries can still see: a ring in which position p lies
    at slot p % slots. A pass may write up to `pass_tokens` = `slots - window + 1` new
    positions: it then overwrites nothing its own queries read; the engine splits longer
    passes. A backend may store more than `slots` (the cpu backend mirrors its rings
    so that every window is contiguous).

    `kv_type` is the number format the keys and values are stored in (`backends.kv_types`:
    "f16", "q8_0" or "f32"): each backend stores the same rounded values, and attention
    reads them as they are stored. A model's layers ask for its chosen type
    (`Transformer.layer_states`, float16 by default); float32 here is for checks."""

    kv_heads: int
    head_dim: int
    value_dim: int
    slots: int
    window: int | None = None
    context: int = 0  # the positions of the sequence it serves (a ring's too; 0: not said)
    kv_type: str = "f32"

    def __post_init__(self) -> None:
        kv_row_bytes(check_kv_type(self.kv_type), self.head_dim)  # refuses Q8_0 rows that are not whole blocks
        kv_row_bytes(self.kv_type, self.value_dim)

    @property
    def bytes_per_position(self) -> int:
        """Bytes one position's keys and values take, every KV head, as `kv_type` stores them."""
        return self.kv_heads * (kv_row_bytes(self.kv_type, self.head_dim) + kv_row_bytes(self.kv_type, self.value_dim))

    @property
    def ring(self) -> bool:
        """Whether positions wrap around (a window smaller than the context)."""
        return self.window is not None

    @property
    def pass_tokens(self) -> int | None:
        """The most new tokens one pass may write (None: any that fit)."""
        return None if self.window is None else self.slots - self.window + 1

    @property
    def rewind_limit(self) -> int | None:
        """The most positions a rollback may forget and still leave every window whole
        (None: any). A ring slot of a forgotten position held, before it, the position
        `slots` earlier, which the next query must not need."""
        return None if self.window is None else self.slots - self.window + 1


@dataclass(frozen=True)
class DeltaNetLayer:
    """The settings of one Gated DeltaNet layer (Qwen3.5's linear attention) that
    `Backend.delta_net` needs: `k_heads` query/key heads and `v_heads` value heads (value head
    j reads query/key head j % k_heads, llama.cpp's tiled order), each `head_dim` wide; `a`
    (v_heads,) = -exp(A_log) and `dt_bias` (v_heads,), float32 host arrays; `eps` of the
    queries' and keys' L2 norms; `chunk`, the length of the chunks a long pass is scanned in."""

    k_heads: int
    v_heads: int
    head_dim: int
    a: np.ndarray
    dt_bias: np.ndarray
    eps: float = 1e-6
    chunk: int = 64


@dataclass(frozen=True)
class RecurrentState:
    """A layer's fixed-size state (a linear-attention or state-space layer): float32 arrays
    of the given shapes, the same size whatever the context (a Gated DeltaNet layer: the
    convolution's last inputs (K - 1, C) and the state matrices (Hv, Dh, Dh)). A rollback cannot
    forget positions of it (`rewind_limit` 0; see `Backend.forget`): the KV cache restores a
    snapshot of it instead (`Backend.snapshot`, `Backend.restore`)."""

    shapes: tuple[tuple[int, ...], ...]
    rewind_limit: int | None = 0
    pass_tokens: int | None = None


LayerState = AttentionState | RecurrentState
"""What one layer keeps between passes (`Backend.allocate_state`)."""


@dataclass(frozen=True)
class Segment:
    """The rows of a pass that continue one sequence: `length` new tokens from position
    `start` on, attending over that sequence's `state` (from `Backend.allocate_state`)."""

    state: Any
    start: Any  # a host int, or a backend's stand-in while it records or traces the pass
    length: int


@dataclass(frozen=True)
class PassInput:
    """What one forward pass reads: `tokens` (T,) at `positions` (T,), split in order among
    `segments` (one sequence's new tokens, or one token of each of B sequences), and
    whether it returns the logits of every row or of the last only. Host int arrays, or a
    backend's stand-ins for them while it records or traces the pass. With `hidden`, the
    pass stops before the output head and returns every row's final normed hidden states
    (T, d_model) instead of logits (embeddings)."""

    tokens: Any
    positions: Any
    segments: tuple[Segment, ...]
    all_logits: bool
    hidden: bool = False


Forward = Callable[[PassInput], Any]
"""A model's forward pass on backend tensors: logits (T, vocab), or (1, vocab) for the last row."""


def positions_of(segments: Sequence[Segment]) -> np.ndarray:
    """Each row's position: start, start + 1, ... for each segment in turn, (T,) int64."""
    return np.concatenate([np.arange(s.start, s.start + s.length, dtype=np.int64) for s in segments])


class Runner:
    """Runs one model's forward passes over new tokens: the engine's one way to run a pass.

    This one calls the forward function, so its ops run one at a time (NumPy, and any pass
    a faster runner does not cover). A backend's own runner may record or compile passes
    and replay them, but returns the same numbers, and takes the same calls.
    """

    def __init__(self, forward: Forward):
        self.forward = forward

    def __call__(self, tokens: Any, segments: Sequence[Segment], all_logits: bool = False, hidden: bool = False) -> Any:
        """Backend logits after `tokens`: (T, vocab) with `all_logits`, else (1, vocab) for
        the last row; with `hidden`, the final normed hidden states (T, d_model) instead
        (recording runners run such a pass op by op). `tokens` (T,) are host ints, split in order among `segments`: one
        sequence's new tokens, or one token for each of several sequences (batched decoding,
        on a backend with `batched_decode`). On a backend with `device_tokens`, a one-token
        pass also takes the token as `argmax` left it on the device."""
        tokens = np.asarray(tokens, dtype=np.int64)
        return self.forward(PassInput(tokens, positions_of(segments), tuple(segments), all_logits, hidden))

    def reset(self) -> None:  # nothing is kept by the plain runner
        """Forget every recorded or compiled pass: the forward function now computes other
        numbers (the model's adapters changed). The next passes record or trace again."""


class Backend(ABC):
    """A compute backend: prepares weights once, then runs the op set on its own tensors."""

    name: str = "abstract"
    memory_rule: ClassVar[MemoryRule] = MAPPED_WEIGHTS
    """What a model needs in memory on this backend (`backends.memory`): by default the
    file's mapped pages, the KV cache and a fixed overhead."""
    device_tokens: bool = False
    """Whether `argmax` leaves the token on the device, and one-token passes take it there,
    so greedy decoding can queue the next step before reading a token back (MLX)."""
    batched_decode: bool = True
    """Whether `rope` takes any positions, not only consecutive ones, and `attention_batch`
    works, so the transformer's `decode_batch` can step several sequences in one pass. On a
    backend without it (MLX) concurrent sequences take their own steps in turn."""
    min_decode_batch: int = 2
    device_sampling: bool = False
    """Whether `sample_token` draws tokens on the device (with `device_tokens`): a sampled
    token then stays there like a greedy one, and reading it costs a 4-byte copy."""
    """The fewest sequences worth one batched pass; fewer take their own decode steps in turn."""
    kv_types: tuple[str, ...] = KV_TYPES
    """The KV types (`backends.kv_types`) `allocate_state` stores; a model that asks for
    another keeps float16, and its load notes say so."""

    @property
    @abstractmethod
    def device_name(self) -> str:
        """A human-readable name of the device the backend computes on."""

    def runner(self, forward: Forward) -> Runner:
        """The runner of a model's passes, `forward` being its forward function. Called once
        per model, at load. By default the ops run one by one."""
        return Runner(forward)

    def argmax(self, logits: Tensor) -> Any:
        """The most likely token after the last row of `logits`: a host int by default; a
        token left on the device where `device_tokens` is set."""
        return int(np.argmax(self.to_host(logits)[-1]))

    def sample_token(
        self, logits: Tensor, temperature: float, top_k: int, top_p: float, min_p: float, uniform: float
    ) -> Any:
        """A token drawn after the last row of `logits`, left on the device, by the host sampler's
        rules (`engine.sampling.Sampler`: top-k, top-p, min-p, then temperature), the draw being
        the first token whose cumulative probability exceeds `uniform` times the total. Only on a
        backend with `device_sampling`."""
        raise BackendError(f"the {self.name} backend draws tokens on the host (it has no device_sampling)")

    # -- weights -------------------------------------------------------------------

    @abstractmethod
    def prepare_weight(self, spec: WeightSpec) -> Any:
        """Turn GGUF blocks into whatever form `linear`, `embedding` and `norm` read.

        Called once per tensor at load time. May keep the blocks quantized.
        """

    def prepare_output(self, weight: Any) -> None:  # noqa: B027  # a no-op by default
        """The output head's prepared weight, told once at load, after `prepare_weight`: it may be
        the token embedding (tied), which a backend can then ready for products at load rather
        than at the first one."""

    # -- ops -------------------------------------------------------------------------

    @abstractmethod
    def embedding(self, weight: Any, token_ids: np.ndarray, scale: float = 1.0) -> Tensor:
        """Rows `token_ids` (int array, shape (T,)) of an embedding table, times `scale`: (T, D)."""

    @abstractmethod
    def linear(self, x: Tensor, weight: Any, bias: Any = None) -> Tensor:
        """x (T, in) times the transpose of weight (out, in), plus bias (out,): (T, out)."""

    def fuse_linear(self, weights: list[Any]) -> Any:
        """Several weights that multiply the same input (q, k, v; gate, up), as one handle
        for `linear_fused`. Called once at load time. A backend may join them into one
        matrix, so one product reads them all; by default they stay apart."""
        return tuple(weights)

    def linear_fused(self, x: Tensor, fused: Any, biases: tuple[Any, ...]) -> list[Tensor]:
        """`linear(x, w, b)` for each weight of `fused` (from `fuse_linear`) and its bias."""
        return [self.linear(x, weight, bias) for weight, bias in zip(fused, biases, strict=True)]

    @abstractmethod
    def rms_norm(self, x: Tensor, weight: Any, eps: float) -> Tensor:
        """RMS-normalise the last axis of x, then multiply by weight.

        x may be (T, D) or (T, heads, Dh); weight has the size of the last axis. (Gemma's
        (1 + w) norms need no offset here: llama.cpp's converter stores 1 + w in the file.)
        """

    @abstractmethod
    def layer_norm(self, x: Tensor, weight: Any, bias: Any, eps: float) -> Tensor:
        """LayerNorm over the last axis of x (T, D): (x - mean) / sqrt(var + eps) * weight, plus
        bias (D,) where not None (Command-R without, StarCoder2 with)."""

    @abstractmethod
    def rope(
        self,
        x: Tensor,
        positions: np.ndarray,
        base: float,
        rope_dim: int,
        neox: bool,
        freq_factors: np.ndarray | None = None,
        mscale: float = 1.0,
    ) -> Tensor:
        """Rotate x (T, heads, Dh) by its positions (int array, shape (T,)).

        Only the first `rope_dim` features rotate. `neox=False` rotates adjacent pairs
        (x0, x1), (x2, x3), ... as llama.cpp does for Llama files, whose q/k rows the
        converter permuted; `neox=True` rotates (x_i, x_{i+rope_dim/2}), the half-split
        form of GPT-NeoX, Qwen and Gemma. `freq_factors` (rope_dim/2,) divide the
        frequencies (Llama 3 long-context scaling, YaRN, LongRoPE). `mscale` multiplies the
        rotated features (YaRN's and LongRoPE's magnitude scaling: cos and sin times it).
        """

    @abstractmethod
    def attention(
        self, q: Tensor, k: Tensor, v: Tensor, cache: Any, layer: int, start: int, settings: LayerAttention
    ) -> Tensor:
        """Causal attention of new tokens over one layer's keys and values.

        q (T, H, Dh), k (T, Hkv, Dh), v (T, Hkv, Dv) for positions start .. start+T-1.
        Writes k and v into entry `layer` of the state `cache` (from `allocate_state`; an
        `AttentionState`) at those positions (a ring's at p % slots), then attends each
        query to positions 0 .. its own (within `settings.window`), or with
        `settings.causal` False to positions 0 .. start+T-1. Returns (T, H * Dv).
        A ring refuses a pass longer than its `pass_tokens`.
        """

    def attention_batch(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        caches: list[Any],
        layer: int,
        starts: list[int],
        settings: LayerAttention,
    ) -> Tensor:
        """`attention` for B sequences with one new token each (batched decoding).

        Row b of q (B, H, Dh), k (B, Hkv, Dh) and v (B, Hkv, Dv) is the token of sequence b, at
        position starts[b] of its own storage caches[b]; it attends to that storage only.
        Returns (B, H * Dv). By default one `attention` per row, the rows joined with NumPy:
        right for backends whose tensors are NumPy arrays (numpy, cpu).
        """
        rows = [
            self.attention(q[b : b + 1], k[b : b + 1], v[b : b + 1], cache, layer, start, settings)  # (1, H * Dv)
            for b, (cache, start) in enumerate(zip(caches, starts, strict=True))
        ]
        return np.concatenate(rows)  # (B, H * Dv)

    @abstractmethod
    def gated_activation(self, gate: Tensor, up: Tensor, kind: str) -> Tensor:
        """act(gate) * up, elementwise, for kind "silu", "gelu_tanh", "sigmoid" or "swiglu_oai".
        For "sigmoid" (Qwen3.5's output gates), gate may also be (T, 1): one gate per row.

        "swiglu_oai" is gpt-oss's clamped form: with g = min(gate, 7) and u = clamp(up, -7, 7),
        g * sigmoid(1.702 * g) * (u + 1).
        """

    @abstractmethod
    def activation(self, x: Tensor, kind: str) -> Tensor:
        """act(x), elementwise, for kind "silu" or "gelu_tanh" (an MLP without a gate)."""

    @abstractmethod
    def scale(self, x: Tensor, factor: float) -> Tensor:
        """x times `factor`, elementwise (Granite's residual multiplier, logit scales)."""

    @abstractmethod
    def route(self, logits: Tensor, routing: Routing) -> Tensor:
        """Each token's experts from its router logits (T, E): (T, 2 * n_used) float32, the
        chosen experts' numbers (exact in float32), then their weights, as `routing` says."""

    @abstractmethod
    def experts(self, x: Tensor, choice: Tensor, weights: ExpertWeights, activation: str) -> Tensor:
        """The mixture of each token's chosen experts: x (T, D), `choice` (T, 2k) from `route`.

        Row t is the sum over its k experts e, with weight w, of
        w * (down_e(act(gate_e x_t + gate_bias_e) * (up_e x_t + up_bias_e)) + down_bias_e),
        `act` as in `gated_activation`. Returns (T, D). Only the chosen experts' weights
        are read.
        """

    def columns(self, x: Tensor, start: int, count: int) -> Tensor:
        """Columns start .. start + count - 1 of x (T, n): (T, count) (Gemma 4's per-layer
        inputs, cut from one product for all layers). By default a NumPy-style slice."""
        return x[:, start : start + count]

    @abstractmethod
    def short_conv(self, x: Tensor, weight: np.ndarray, states: Sequence[Any], layer: int) -> Tensor:
        """silu of a causal depthwise convolution of x (T, C) over time, each channel c with
        its kernel weight[c] (C, K) (float32, on the host; the last column multiplies the
        current row), continuing each sequence's last K - 1 inputs (entry 0 of recurrent layer
        `layer` of its state, (K - 1, C)), which it then replaces by the newest ones. With one
        state every row continues it; with B states (batched decoding) row b continues states[b].
        Returns (T, C)."""

    @abstractmethod
    def delta_net(
        self, x: Tensor, alpha: Tensor, beta: Tensor, settings: DeltaNetLayer, states: Sequence[Any], layer: int
    ) -> Tensor:
        """The gated delta rule (Gated DeltaNet) over x (T, C) from `short_conv`, whose
        columns are the queries (Hk * Dh), keys (Hk * Dh) and values (Hv * Dh); alpha and beta
        (T, Hv) are the gate and write-strength projections. For each value head, with q and k
        L2-normalised (`settings.eps`), q scaled by Dh ** -0.5, g = a * softplus(alpha + dt_bias),
        b = sigmoid(beta), and the head's state S (Dh, Dh) (entry 1 of recurrent layer `layer`,
        (Hv, Dh, Dh)):
            S = exp(g) S;  S = S + k (b (v - k S))^T;  out = q S
        row by row; a pass of several rows may compute it in chunks of `settings.chunk` (the
        chunked form, same numbers up to rounding). States as in `short_conv`. Returns (T, Hv * Dh)."""

    @abstractmethod
    def add(self, a: Tensor, b: Tensor) -> Tensor:
        """Elementwise a + b (the residual connection)."""

    @abstractmethod
    def softcap(self, x: Tensor, cap: float) -> Tensor:
        """cap * tanh(x / cap), elementwise (Gemma's final-logit soft-capping)."""

    @abstractmethod
    def to_host(self, x: Tensor) -> np.ndarray:
        """Copy a tensor back to the host as a float32 NumPy array."""

    # -- per-layer state (the KV cache, and later recurrent states) --------------------

    @abstractmethod
    def allocate_state(self, layers: "list[LayerState]") -> Any:
        """Allocate one sequence's state once, up front: one entry per layer, as `layers`
        describes it (see `AttentionState`, `RecurrentState`). `attention(..., layer=i, ...)`
        reads and writes entry i. Attention states start empty, recurrent states at zero.
        The state keeps the layouts it was made for as its `layers` attribute."""

    @abstractmethod
    def state_bytes(self, state: Any) -> int:
        """Bytes the state occupies."""

    def state_arrays(self, state: Any) -> list[np.ndarray]:
        """The host arrays that hold `state`, in an order fixed by its layout: what saving a
        conversation writes, and what restoring one writes back into before calling
        `load_state_arrays`. By default every NumPy array among the state's attributes (and
        in their lists and tuples), by attribute name: views of the state itself, whatever
        their dtype. A backend whose arrays are views of one buffer returns the buffer; one
        whose state lives on a device returns host copies."""
        found: list[np.ndarray] = []

        def collect(value: Any) -> None:
            if isinstance(value, np.ndarray):
                found.append(value)
            elif isinstance(value, list | tuple):
                for item in value:
                    collect(item)

        for name in sorted(vars(state)):
            collect(vars(state)[name])
        return found

    def load_state_arrays(self, state: Any, arrays: list[np.ndarray]) -> None:  # noqa: B027  # views: written
        """Make `state` hold `arrays` (from `state_arrays`, written by the caller). Nothing
        to do by default: those arrays are the state's own memory."""

    def forget(self, state: Any, start: int, end: int) -> None:  # noqa: B027  # a no-op by default
        """Forget positions start .. end-1 of every attention layer (a rollback, as after a
        rejected speculative draft); from `start` 0, every layer returns to its fresh state,
        recurrent ones included. `attention` writes a position before any query may see
        it, so stale values past the end get no weight and keeping them is correct (MLX); a
        backend whose storage is host memory zeroes them, so a rolled-back state equals a
        fresh one. By default nothing is done.

        What a rollback may undo depends on the layer (see `LayerState.rewind_limit`): a
        full attention layer any number of positions; a windowed ring `slots - window + 1`;
        a recurrent state none, since its past is summed into it. Past that limit the
        engine (`engine.kv_cache.KVCache`) drops the whole state and reads the text again:
        correct, and slow, so it says so where it happens."""

    def snapshot(self, state: Any) -> Any:
        """A copy of the recurrent layers' arrays of `state` (attention layers are not copied:
        they can forget positions), for `restore`. By default for states that keep them as
        host arrays in `arrays` (NumPy, cpu)."""
        return [tuple(a.copy() for a in arrays) for arrays in state.arrays]

    def restore(self, state: Any, snapshot: Any) -> None:
        """Put the recurrent layers' arrays of `snapshot` (from `snapshot`) back into `state`."""
        for arrays, saved in zip(state.arrays, snapshot, strict=True):
            for array, value in zip(arrays, saved, strict=True):
                array[...] = value

    @property
    def load_notes(self) -> list[str]:
        """What preparing the weights changed that the user should hear of (a tensor type
        converted at load), one sentence each. None by default."""
        return []

    def close(self) -> None:  # noqa: B027  # a no-op unless the backend holds memory of its own
        """Release what the backend holds (device memory, caches). Idempotent."""
