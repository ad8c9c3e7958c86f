"""The decoder-only transformer that every architecture file specialises.

Written once against the backend contract (`backends/base.py`), so the same forward pass
runs on every backend. A model is an embedding, a stack of layers built from blocks
(`engine.models.layer.DecoderLayer` around a mixer and a feed-forward block), a final
norm and the output projection. An architecture file says only how it differs: its
`Family` (which optional tensors it requires, its activation, how its layers attend), the
blocks of each layer (`layer_blocks`), and where that is not enough, an override of
`layer_rope` or `layer_attention`.

Every pass goes through the backend's runner (`backends.base.Runner`), which calls
`logits`, the one forward path, op by op or replays a recorded or compiled pass.
"""

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, ClassVar

import numpy as np

from backends.base import AttentionState, Backend, LayerAttention, LayerState, PassInput, Segment
from backends.kv_types import DEFAULT_KV_TYPE, check_kv_type, fits_kv_type
from engine.config import Family, ModelConfig
from engine.gguf_file import GGUFFile
from engine.models.attention import Attention
from engine.models.block import Block, LayerReader, Linear, check_layer_tensors
from engine.models.layer import DecoderLayer, norm
from engine.models.lora import AdapterStack
from engine.models.mlp import DenseMLP
from engine.models.rope_scaling import LayerRope, linear_divisors, yarn_divisors, yarn_mscale


class Transformer:
    """A decoder-only transformer: embedding, N layers, final norm, output projection.

    The features that tell families apart (activation, embedding scale, sliding windows,
    RoPE bases, soft-capping) come from the config, which `family` shaped; subclasses
    (one per architecture file) set `family`, and override `layer_blocks`, `layer_rope`
    or `layer_attention` where that is not enough. All three are asked once per layer, at load.
    """

    family: ClassVar[Family]
    layer_class: ClassVar[type[DecoderLayer]] = DecoderLayer  # the norms around each layer's blocks
    causal: ClassVar[bool] = True  # False: an embedding model whose tokens all see each other (one pass a text)
    final_norm: ClassVar[bool] = True  # a norm after the last layer (BERT's layers end in theirs)

    def __init__(
        self,
        config: ModelConfig,
        model_file: GGUFFile,
        backend: Backend,
        on_weight: Callable[[int, int], None] | None = None,
    ):
        """Prepare every weight on `backend`; `on_weight(done, total)` follows the progress.

        `on_weight` may raise (for example to cancel loading); the exception propagates.
        """
        self.config = config
        self.backend = backend
        self.kv_type = DEFAULT_KV_TYPE  # what attention layers store keys and values as (`set_kv_type`)
        self._file = model_file
        reader = LayerReader(model_file, backend, on_weight)
        self.token_embd = reader.global_weight("token_embd.weight")
        self.output_norm = reader.global_weight("output_norm.weight") if self.final_norm else None
        self.output_norm_bias = reader.optional_weight("output_norm.bias")
        has_output = "output.weight" in model_file.tensors
        self.output = reader.global_weight("output.weight") if has_output else self.token_embd
        backend.prepare_output(self.output)
        self.read_globals(reader)
        self.layers = [self._layer(reader.at(i), i) for i in range(config.n_layers)]
        self.read_extra(reader)
        # the output head, by the name an adapter on it (lm_head) targets, tied or not
        self.output_linear = Linear(backend, "output.weight", self.output, (config.vocab_size, config.d_model))
        self.linears = {**reader.linears, "output.weight": self.output_linear}  # what adapters may target
        self.runner = backend.runner(self.logits)
        self.adapters = AdapterStack(
            backend, config.architecture, model_file.metadata, self.linears, on_change=lambda: self.runner.reset()
        )

    def _layer(self, reader: LayerReader, i: int) -> DecoderLayer:
        mixer, feed_forward = self.layer_blocks(self.config, i)
        return self.layer_class(reader, self.config, mixer(reader, self, i), feed_forward(reader, self, i))

    # -- what architectures override (asked once per layer, at load) -------------------

    def read_extra(self, reader: LayerReader) -> None:
        """Prepare the tensors outside the layers that an architecture adds (none here)."""

    def embed(self, p: PassInput) -> Any:
        """The rows entering the first layer: the tokens' embeddings (T, D), scaled as the family says."""
        return self.backend.embedding(self.token_embd, p.tokens, self.config.embedding_scale)

    def project_embedding(self, pooled: np.ndarray) -> np.ndarray:
        """What an embedding model makes of its pooled hidden state (d_model,) before the L2
        norm: here the state itself; EmbeddingGemma's dense projections."""
        return pooled

    @classmethod
    def read_config(cls, f: GGUFFile) -> ModelConfig:
        """The config of `f`, read with this architecture's family settings (an architecture
        with settings of its own per layer reads those too). Raises ModelFileError."""
        return ModelConfig.from_gguf(f, cls.family)

    @property
    def load_notes(self) -> list[str]:
        """What the model left out of the file that the user should hear of (none here)."""
        return []

    def read_globals(self, reader: LayerReader) -> None:
        """Prepare the tensors outside the layers that this architecture adds (none here)."""

    @classmethod
    def layer_blocks(cls, config: ModelConfig, i: int) -> tuple[type[Any], type[Any]]:
        """The mixer and feed-forward block classes of layer i: attention and a dense MLP.
        Each is built as `block(reader, plan, i)`, the model as its `LayerPlan` (all a block may
        ask of it), and lists its tensors in `TENSORS`."""
        return Attention, DenseMLP

    @classmethod
    def check_tensors(cls, f: GGUFFile, config: ModelConfig) -> None:
        """Check every per-layer tensor the blocks need, and its shape; ModelFileError naming
        the first that is missing or misshaped."""

        def blocks(i: int) -> tuple[type[Block], ...]:
            return (cls.layer_class, *cls.layer_blocks(config, i))

        check_layer_tensors(f, config, blocks, cls.family.layer_tensors, final_norm=cls.final_norm)

    def layer_attention(self, i: int) -> LayerAttention:
        """Attention settings of layer i: scale, sliding window, soft-capping."""
        cfg = self.config
        window = cfg.sliding_window if cfg.is_sliding(i) else None
        return LayerAttention(cfg.attn_scale, window, cfg.attn_logit_softcap)

    def layer_rope(self, i: int) -> LayerRope | None:
        """RoPE base of layer i, with the file's RoPE scaling (linear: global layers only;
        YaRN) as frequency divisors; None for a layer without positions (`uses_rope`)."""
        cfg, base = self.config, self.config.layer_rope_base(i)
        if not cfg.uses_rope(i):
            return None
        factor = cfg.rope_scaling_factor
        if cfg.rope_scaling_type == "linear" and factor and not cfg.is_sliding(i):
            return LayerRope(base, linear_divisors(cfg.rope_dim, factor))
        if cfg.rope_scaling_type == "yarn" and factor:
            divisors = yarn_divisors(
                cfg.rope_dim, base, factor, cfg.rope_original_context, cfg.yarn_beta_fast, cfg.yarn_beta_slow
            )
            return LayerRope(base, divisors, yarn_mscale(factor))
        return LayerRope(base)

    def set_kv_type(self, kv_type: str) -> str:
        """Store the keys and values of caches made from now on as `kv_type`
        (`backends.kv_types`). Returns a sentence for the load notes where float16 is kept
        instead (a backend without the type; Q8_0 needs rows of whole blocks of 32), else ""."""
        check_kv_type(kv_type)
        if kv_type not in self.backend.kv_types:
            self.kv_type = DEFAULT_KV_TYPE
            return f"the {self.backend.name} backend has no {kv_type} KV cache: it stores float16"
        self.kv_type = kv_type
        states = [s for s in self.layer_states(1) if isinstance(s, AttentionState)]
        if any(s.kv_type != kv_type for s in states):
            dims = sorted({d for s in states for d in (s.head_dim, s.value_dim) if not fits_kv_type(kv_type, d)})
            sizes = ", ".join(map(str, dims))
            return f"heads of {sizes} values do not split into Q8_0 blocks of 32: the KV cache is float16"
        return ""

    def layer_states(self, n_ctx: int) -> list[LayerState]:
        """What each layer keeps between passes, for a context of `n_ctx` positions; attention
        layers store `kv_type` (float16 where Q8_0 does not fit their heads)."""
        return [self._typed(layer.mixer.state(n_ctx)) for layer in self.layers]

    def _typed(self, state: LayerState) -> LayerState:
        if not isinstance(state, AttentionState):
            return state
        fits = fits_kv_type(self.kv_type, state.head_dim) and fits_kv_type(self.kv_type, state.value_dim)
        return replace(state, kv_type=self.kv_type if fits else DEFAULT_KV_TYPE)

    # -- forward ---------------------------------------------------------------------

    def forward(
        self, token_ids: Sequence[int] | np.ndarray, start: int, state: Any, all_logits: bool = False
    ) -> np.ndarray:
        """Run tokens at positions start.. through the model, writing the per-layer `state`.

        Returns float32 logits on the host: (T, vocab) if `all_logits`, else (1, vocab) for
        the last position only.
        """
        logits = self.runner(token_ids, [Segment(state, start, len(token_ids))], all_logits)
        return self.backend.to_host(logits)

    def hidden_states(self, token_ids: Sequence[int] | np.ndarray, start: int, state: Any) -> np.ndarray:
        """As `forward`, but the final normed hidden states of every row, before the output
        head: float32 (T, d_model) on the host (what embeddings pool)."""
        hidden = self.runner(token_ids, [Segment(state, start, len(token_ids))], all_logits=True, hidden=True)
        return self.backend.to_host(hidden)

    def decode_step(self, state: Any) -> Callable[[Any, int], Any]:
        """One-token passes on `state`: step(token, start) -> backend logits (1, vocab).
        `token` is a host int, or where the backend has `device_tokens`, its `argmax`."""
        return lambda token, start: self.runner([token], [Segment(state, start, 1)])

    def decode_batch(self, token_ids: np.ndarray, positions: np.ndarray, states: list[Any]) -> Any:
        """One new token for each of B sequences, each at its own position of its own state.

        `token_ids` (B,) and `positions` (B,) are host ints; sequence b attends only to
        `states[b]`. Returns backend logits (B, vocab). Embedding, norms, matrix products
        (one product over the B rows reads each weight once), RoPE and the MLP are
        row-wise; attention runs per sequence (`Backend.attention_batch`). Needs a backend
        with `batched_decode`.
        """
        segments = [Segment(state, int(position), 1) for state, position in zip(states, positions, strict=True)]
        return self.runner(token_ids, segments, all_logits=True)

    def logits(self, p: PassInput) -> Any:
        """The forward pass on backend tensors: logits (T, vocab), or (1, vocab) for the last row.

        `p` holds host arrays, or the stand-ins a backend records or traces them as (see
        `backends.base.Runner`).
        """
        x = self.embed(p)  # (T, D)
        for layer in self.layers:
            x = layer(x, p)
        return self.head(x, p)

    def head(self, x: Any, p: PassInput) -> Any:
        """The residual stream after the last layer (T, D) to what the pass returns: logits
        (T, vocab) or (1, vocab), or the final normed hidden states (`p.hidden`)."""
        be, cfg = self.backend, self.config
        if not p.all_logits:
            x = x[-1:]  # (1, D)
        if self.output_norm is not None:
            x = norm(be, cfg, x, self.output_norm, self.output_norm_bias)
        if p.hidden:
            return x  # (T, D): the states the output head would read
        logits = self.output_linear(x)  # (T or 1, vocab)
        if cfg.logit_scale != 1.0:
            logits = be.scale(logits, cfg.logit_scale)
        if cfg.final_logit_softcap:
            logits = be.softcap(logits, cfg.final_logit_softcap)
        return logits
