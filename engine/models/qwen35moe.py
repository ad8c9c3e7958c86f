"""Qwen3.5-MoE and Qwen3.6-MoE (Qwen3.6-35B-A3B): Qwen3.5's hybrid stack with a mixture of
experts and a shared expert in place of the MLP.

The router is Qwen3-MoE's (softmax, top k, weights divided by their sum); beside the chosen
experts every token goes through the shared expert, a SwiGLU whose output is multiplied by
sigmoid(x . w), its gate (`ffn_gate_inp_shexp`).
"""

from typing import Any

from backends.base import PassInput
from engine.config import ModelConfig, bad_file, required_tensor
from engine.gguf_file import GGUFFile
from engine.models import qwen35
from engine.models.block import LayerPlan, LayerReader, TensorSpec
from engine.models.moe import MoEMLP

SHARED_ROUTER = "ffn_gate_inp_shexp.weight"  # (1, D) as the converter writes it, (D,) as the quantizer does


class SharedExpertMoE(MoEMLP):
    """A mixture of experts plus a gated shared expert."""

    TENSORS = (
        *MoEMLP.TENSORS,
        TensorSpec("ffn_gate_shexp.weight", "shared_gate", lambda c: (c.d_shared_expert, c.d_model)),
        TensorSpec("ffn_up_shexp.weight", "shared_up", lambda c: (c.d_shared_expert, c.d_model)),
        TensorSpec("ffn_down_shexp.weight", "shared_down", lambda c: (c.d_model, c.d_shared_expert)),
    )  # and SHARED_ROUTER, checked by the model (its shape varies)
    shared_gate: Any
    shared_up: Any
    shared_down: Any

    def __init__(self, reader: LayerReader, plan: LayerPlan, index: int):
        super().__init__(reader, plan, index)
        d_model = plan.config.d_model
        self.shared_router = reader.global_weight(f"blk.{index}.{SHARED_ROUTER}", (1, d_model))  # (1, D)
        self.shared_gate_up = self.backend.fuse_linear([self.shared_gate, self.shared_up])
        self.shared_down_linear = reader.linear("ffn_down_shexp.weight", self.shared_down)

    def __call__(self, h: Any, p: PassInput) -> Any:
        """The experts' mixture of `h` (T, D) plus the gated shared expert's output: (T, D)."""
        be = self.backend
        gate, up = be.linear_fused(h, self.shared_gate_up, (None, None))  # (T, F) each
        shared = self.shared_down_linear(be.gated_activation(gate, up, self.activation))  # (T, D)
        shared = be.gated_activation(be.linear(h, self.shared_router), shared, "sigmoid")  # (T, 1) gates (T, D)
        return be.add(super().__call__(h, p), shared)


class Model(qwen35.Model):
    """A Qwen3.5-MoE model."""

    family = qwen35.Model.family  # the same settings; the feed-forward block differs
    feed_forward = SharedExpertMoE

    @classmethod
    def check_tensors(cls, f: GGUFFile, config: ModelConfig) -> None:
        """As Qwen3.5's, and each layer's shared-expert gate: (1, D) or (D,)."""
        super().check_tensors(f, config)
        for i in range(config.n_layers):
            name = f"blk.{i}.{SHARED_ROUTER}"
            shape = required_tensor(f, name).shape
            if shape not in ((config.d_model,), (1, config.d_model)):
                bad_file(f, f"the tensor {name!r} has shape {shape}, but the metadata implies ({config.d_model},)")
