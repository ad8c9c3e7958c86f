"""One decoder layer: the norms and residual connections around its two blocks.

- `DecoderLayer`: a norm, the mixer (attention), a residual; a norm, the feed-forward block,
  a residual; with the norms after each (Gemma 2 and 3) where the file has them, and a
  multiplier on each block's output (Granite's residual scale).
- `ParallelLayer`: one norm, then the mixer and the feed-forward block side by side on it,
  both added to the residual (Command-R, Command R7B).
- `PostNormLayer`: no norm before a block, one after each (OLMo 2).

The norms are RMS norms or LayerNorms, with biases where the file has them, as the family
says (`ModelConfig.norm`). The mixer and the feed-forward block are whatever the
architecture puts in the layer (`Transformer.layer_blocks`): attention, a dense MLP, a
mixture of experts, later a recurrent mixer, all with the same call
`block(h, pass_input) -> (T, D)`. An architecture picks its layer class
(`Transformer.layer_class`).
"""

from typing import Any, ClassVar, Protocol

from backends.base import Backend, LayerState, PassInput
from engine.config import ModelConfig
from engine.models.block import Block, LayerReader, TensorSpec

POST_NORMS = ("post_attention_norm.weight", "post_ffw_norm.weight")


class LayerBlock(Protocol):
    """A mixer or feed-forward block as a layer calls it."""

    def __call__(self, h: Any, p: PassInput) -> Any:
        """The block's output for `h` (T, D): (T, D)."""


class Mixer(LayerBlock, Protocol):
    """The block that mixes positions (attention, or later a recurrent layer): it also says
    what the layer keeps between passes."""

    def state(self, n_ctx: int) -> LayerState:
        """The layer's state for a context of `n_ctx` positions."""


def norm(backend: Backend, config: ModelConfig, x: Any, weight: Any, bias: Any = None) -> Any:
    """The family's norm of `x` over its last axis: RMS, or LayerNorm (with `bias` if any)."""
    if config.norm == "layer":
        return backend.layer_norm(x, weight, bias, config.norm_eps)
    return backend.rms_norm(x, weight, config.norm_eps)


def _d_model(c: ModelConfig) -> tuple[int, ...]:
    return (c.d_model,)


class DecoderLayer(Block):
    """Pre-norm residual layer around a mixer and a feed-forward block."""

    TENSORS: ClassVar[tuple[TensorSpec, ...]] = (
        TensorSpec("attn_norm.weight", "attn_norm", _d_model),
        TensorSpec("ffn_norm.weight", "ffn_norm", _d_model),
        TensorSpec("attn_norm.bias", "attn_norm_bias", _d_model, optional=True),
        TensorSpec("ffn_norm.bias", "ffn_norm_bias", _d_model, optional=True),
        TensorSpec("post_attention_norm.weight", "post_attn_norm", _d_model, optional=True),
        TensorSpec("post_ffw_norm.weight", "post_ffw_norm", _d_model, optional=True),
    )
    attn_norm: Any = None  # where a subclass's table has no such tensor
    ffn_norm: Any = None
    attn_norm_bias: Any = None
    ffn_norm_bias: Any = None
    post_attn_norm: Any = None
    post_ffw_norm: Any = None

    def __init__(self, reader: LayerReader, config: ModelConfig, mixer: Mixer, feed_forward: LayerBlock):
        self.backend: Backend = reader.backend
        self.config = config
        self.mixer, self.feed_forward = mixer, feed_forward
        self.read_tensors(reader)

    def __call__(self, x: Any, p: PassInput) -> Any:
        """The residual stream `x` (T, D) after this layer: (T, D)."""
        x = self._add(x, self._branch(self.mixer, (self.attn_norm, self.attn_norm_bias, self.post_attn_norm), x, p))
        return self._add(
            x, self._branch(self.feed_forward, (self.ffn_norm, self.ffn_norm_bias, self.post_ffw_norm), x, p)
        )

    def _branch(self, block: LayerBlock, norms: tuple[Any, Any, Any], x: Any, p: PassInput) -> Any:
        """block(norm(x)), normed again after where there is a post-norm; (pre, its bias, post)."""
        pre, pre_bias, post = norms
        h = block(x if pre is None else norm(self.backend, self.config, x, pre, pre_bias), p)
        return h if post is None else norm(self.backend, self.config, h, post)

    def _add(self, x: Any, h: Any) -> Any:
        """The residual add, Granite's multiplier on the block's output first."""
        if self.config.residual_scale != 1.0:
            h = self.backend.scale(h, self.config.residual_scale)
        return self.backend.add(x, h)


class ParallelLayer(DecoderLayer):
    """x + mixer(n) + feed_forward(n) with n = norm(x): the blocks side by side (Command-R)."""

    TENSORS = (
        TensorSpec("attn_norm.weight", "attn_norm", _d_model),
        TensorSpec("attn_norm.bias", "attn_norm_bias", _d_model, optional=True),
    )

    def __call__(self, x: Any, p: PassInput) -> Any:
        n = norm(self.backend, self.config, x, self.attn_norm, self.attn_norm_bias)
        return self._add(self._add(x, self.feed_forward(n, p)), self.mixer(n, p))


class PostNormLayer(DecoderLayer):
    """No norm before a block, one after each: x + norm(block(x)) (OLMo 2)."""

    TENSORS = (
        TensorSpec("post_attention_norm.weight", "post_attn_norm", _d_model),
        TensorSpec("post_ffw_norm.weight", "post_ffw_norm", _d_model),
    )
