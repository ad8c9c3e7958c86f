"""The dense feed-forward block: a gated MLP, act(x W_gate) * (x W_up), then W_down."""

from typing import Any, ClassVar

from backends.base import Backend, PassInput
from engine.models.block import Block, LayerPlan, LayerReader, TensorSpec


class DenseMLP(Block):
    """A gated MLP (SwiGLU, or GELU-gated for Gemma) over every row."""

    TENSORS: ClassVar[tuple[TensorSpec, ...]] = (
        TensorSpec("ffn_gate.weight", "w_gate", lambda c: (c.d_ff, c.d_model)),
        TensorSpec("ffn_up.weight", "w_up", lambda c: (c.d_ff, c.d_model)),
        TensorSpec("ffn_down.weight", "w_down", lambda c: (c.d_model, c.d_ff)),
    )
    w_gate: Any
    w_up: Any
    w_down: Any

    def __init__(self, reader: LayerReader, plan: LayerPlan, index: int):
        self.backend: Backend = reader.backend
        self.activation = plan.config.activation
        self.read_tensors(reader)
        self.gate_up = self.backend.fuse_linear([self.w_gate, self.w_up])
        self.read_linears(reader)

    def read_linears(self, reader: LayerReader) -> None:
        """The `Linear`s adapters reach: gate, up and down."""
        self.gate = reader.linear("ffn_gate.weight", self.w_gate)
        self.up = reader.linear("ffn_up.weight", self.w_up)
        self.down = reader.linear("ffn_down.weight", self.w_down)

    def __call__(self, h: Any, p: PassInput) -> Any:
        """The MLP of `h` (T, D): (T, D)."""
        be = self.backend
        gate, up = be.linear_fused(h, self.gate_up, (None, None))  # (T, F) each
        gate, up = self.gate.adapt(h, gate), self.up.adapt(h, up)  # LoRA, where adapters are on
        return self.down(be.gated_activation(gate, up, self.activation))


class PlainMLP(Block):
    """An MLP without a gate: act(x W_up + b_up) W_down + b_down (StarCoder2)."""

    TENSORS = (
        TensorSpec("ffn_up.weight", "w_up", lambda c: (c.d_ff, c.d_model)),
        TensorSpec("ffn_down.weight", "w_down", lambda c: (c.d_model, c.d_ff)),
        TensorSpec("ffn_up.bias", "b_up", lambda c: (c.d_ff,), optional=True),
        TensorSpec("ffn_down.bias", "b_down", lambda c: (c.d_model,), optional=True),
    )
    w_up: Any
    w_down: Any
    b_up: Any
    b_down: Any

    def __init__(self, reader: LayerReader, plan: LayerPlan, index: int):
        self.backend: Backend = reader.backend
        self.activation = plan.config.activation
        self.read_tensors(reader)
        self.up = reader.linear("ffn_up.weight", self.w_up)
        self.down = reader.linear("ffn_down.weight", self.w_down)

    def __call__(self, h: Any, p: PassInput) -> Any:
        """The MLP of `h` (T, D): (T, D)."""
        up = self.up(h, self.b_up)  # (T, F)
        return self.down(self.backend.activation(up, self.activation), self.b_down)
