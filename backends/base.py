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
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

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
    """

    n_experts: int
    n_used: int
    order: str = "softmax_top_k"
    normalize: bool = True


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
    so that every window is contiguous)."""

    kv_heads: int
    head_dim: int
    value_dim: int
    slots: int
    window: int | None = None
    context: int = 0  # the positions of the sequence it serves (a ring's too; 0: not said)

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
class RecurrentState:
    """A layer's fixed-size state (a linear-attention or state-space layer): float32 arrays
    of the given shapes, the same size whatever the context. A rollback cannot forget
    positions of it (`rewind_limit` 0; see `Backend.forget`)."""

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
    """The fewest sequences worth one batched pass; fewer take their own decode steps in turn."""

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

    # -- weights -------------------------------------------------------------------

    @abstractmethod
    def prepare_weight(self, spec: WeightSpec) -> Any:
        """Turn GGUF blocks into whatever form `linear`, `embedding` and `norm` read.

        Called once per tensor at load time. May keep the blocks quantized.
        """

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
        """act(gate) * up, elementwise, for kind "silu", "gelu_tanh" or "swiglu_oai".

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

    @property
    def load_notes(self) -> list[str]:
        """What preparing the weights changed that the user should hear of (a tensor type
        converted at load), one sentence each. None by default."""
        return []

    def close(self) -> None:  # noqa: B027  # a no-op unless the backend holds memory of its own
        """Release what the backend holds (device memory, caches). Idempotent."""
