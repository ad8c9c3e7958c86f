"""Qwen3.5 and Qwen3.6, dense (Qwen3.6-27B): a hybrid stack of Gated DeltaNet layers and gated
full-attention layers, three to one by default (the file says which: `recurrent_layers`).

The DeltaNet layers keep a state of fixed size (`engine.models.delta_net.GatedDeltaNet`); the
attention layers have q/k norms, an output gate per head and partial RoPE (a quarter of each
head by default, `rope.dimension_count`; text positions make llama.cpp's interleaved M-RoPE
plain NeoX RoPE). The feed-forward block is a SwiGLU. A multi-token-prediction layer in the
file (`nextn_predict_layers`) is not run, and a vision tower lives in a file of its own
(mmproj), which Sprig does not read.
"""

from typing import Any

from engine.config import Family, ModelConfig, bad_file
from engine.gguf_file import GGUFFile
from engine.models.attention import QK_NORM
from engine.models.common import Transformer
from engine.models.delta_net import GatedAttention, GatedDeltaNet, HybridLayer
from engine.models.mlp import DenseMLP


class Model(Transformer):
    """A Qwen3.5 model."""

    family = Family(layer_tensors=QK_NORM)
    layer_class = HybridLayer
    feed_forward: type[Any] = DenseMLP

    @classmethod
    def layer_blocks(cls, config: ModelConfig, i: int) -> tuple[type[Any], type[Any]]:
        """A Gated DeltaNet or gated attention, as the file marks the layer; the feed-forward block."""
        return (GatedDeltaNet if config.recurrent_layers[i] else GatedAttention), cls.feed_forward

    @property
    def load_notes(self) -> list[str]:
        """The multi-token-prediction layers of the file, which are not run."""
        if not self.config.unused_layers:
            return []
        return [
            f"The file's {self.config.unused_layers} multi-token-prediction layer(s) are not run "
            "(Sprig drafts with prompt lookup or a draft model)."
        ]

    @classmethod
    def check_tensors(cls, f: GGUFFile, config: ModelConfig) -> None:
        """As every model, once the file is known to say which layers are recurrent."""
        if not config.recurrent_layers:
            bad_file(f, f"a {f.architecture} file needs the Gated DeltaNet settings ({f.architecture}.ssm.*)")
        super().check_tensors(f, config)
