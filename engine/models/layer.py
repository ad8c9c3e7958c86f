"""One decoder layer: a norm, the mixer (attention), a residual; a norm, the feed-forward
block, a residual; with the norms after each (Gemma 2 and 3) where the file has them.

The mixer and the feed-forward block are whatever the architecture puts in the layer
(`Transformer.layer_blocks`): attention and a dense MLP today; a recurrent mixer or a
mixture of experts has the same call, `block(h, pass_input) -> (T, D)`.
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


class DecoderLayer(Block):
    """Pre-norm residual layer around a mixer and a feed-forward block."""

    TENSORS: ClassVar[tuple[TensorSpec, ...]] = (
        TensorSpec("attn_norm.weight", "attn_norm", lambda c: (c.d_model,)),
        TensorSpec("ffn_norm.weight", "ffn_norm", lambda c: (c.d_model,)),
        TensorSpec("post_attention_norm.weight", "post_attn_norm", lambda c: (c.d_model,), optional=True),
        TensorSpec("post_ffw_norm.weight", "post_ffw_norm", lambda c: (c.d_model,), optional=True),
    )
    attn_norm: Any
    ffn_norm: Any
    post_attn_norm: Any = None  # where a subclass's table has no such tensor
    post_ffw_norm: Any = None

    def __init__(self, reader: LayerReader, config: ModelConfig, mixer: Mixer, feed_forward: LayerBlock):
        self.backend: Backend = reader.backend
        self.eps = config.rms_eps
        self.mixer, self.feed_forward = mixer, feed_forward
        self.read_tensors(reader)

    def __call__(self, x: Any, p: PassInput) -> Any:
        """The residual stream `x` (T, D) after this layer: (T, D)."""
        x = self.backend.add(x, self._branch(self.mixer, self.attn_norm, self.post_attn_norm, x, p))
        return self.backend.add(x, self._branch(self.feed_forward, self.ffn_norm, self.post_ffw_norm, x, p))

    def _branch(self, block: LayerBlock, norm: Any, post_norm: Any, x: Any, p: PassInput) -> Any:
        h = block(self.backend.rms_norm(x, norm, self.eps), p)
        return h if post_norm is None else self.backend.rms_norm(h, post_norm, self.eps)
