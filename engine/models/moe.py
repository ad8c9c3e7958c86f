"""The mixture-of-experts feed-forward block: a router picks each token's experts, and the
token's output is their outputs mixed by the router's weights.

The router is an ordinary matrix product (with a bias for gpt-oss); choosing the experts
(`Backend.route`) and running them (`Backend.experts`) are ops of their own, so that the
data-dependent choice stays inside the backend: a recorded or compiled pass holds it, and
only the chosen experts' weights are read.
"""

from typing import Any, ClassVar

from backends.base import Backend, ExpertWeights, PassInput, Routing
from engine.models.block import Block, LayerPlan, LayerReader, TensorSpec


class MoEMLP(Block):
    """n experts, each a gated MLP, of which each token goes through its router's top k."""

    TENSORS: ClassVar[tuple[TensorSpec, ...]] = (
        TensorSpec("ffn_gate_inp.weight", "router", lambda c: (c.n_experts, c.d_model)),
        TensorSpec("ffn_gate_exps.weight", "gate", lambda c: (c.n_experts, c.d_expert, c.d_model)),
        TensorSpec("ffn_up_exps.weight", "up", lambda c: (c.n_experts, c.d_expert, c.d_model)),
        TensorSpec("ffn_down_exps.weight", "down", lambda c: (c.n_experts, c.d_model, c.d_expert)),
        TensorSpec("ffn_gate_inp.bias", "router_bias", lambda c: (c.n_experts,), optional=True),
        TensorSpec("ffn_gate_exps.bias", "gate_bias", lambda c: (c.n_experts, c.d_expert), optional=True),
        TensorSpec("ffn_up_exps.bias", "up_bias", lambda c: (c.n_experts, c.d_expert), optional=True),
        TensorSpec("ffn_down_exps.bias", "down_bias", lambda c: (c.n_experts, c.d_model), optional=True),
    )
    router: Any
    gate: Any
    up: Any
    down: Any
    router_bias: Any
    gate_bias: Any
    up_bias: Any
    down_bias: Any

    def __init__(self, reader: LayerReader, plan: LayerPlan, index: int):
        cfg = plan.config
        self.backend: Backend = reader.backend
        self.activation = cfg.activation
        self.routing = Routing(cfg.n_experts, cfg.n_experts_used, cfg.expert_routing, cfg.expert_weights_norm)
        self.read_tensors(reader)
        self.experts = ExpertWeights(self.gate, self.up, self.down, self.gate_bias, self.up_bias, self.down_bias)

    def __call__(self, h: Any, p: PassInput) -> Any:
        """The mixture of experts of `h` (T, D): (T, D)."""
        be = self.backend
        logits = be.linear(h, self.router, self.router_bias)  # (T, E)
        choice = be.route(logits, self.routing)  # (T, 2k): experts, then weights
        return be.experts(h, choice, self.experts, self.activation)
