"""SmolLM3 (Hugging Face, 3B).

Llama's layout (q/k rows permuted by the converter) in which every fourth layer uses no
positions at all (NoPE): llama.cpp fixes the step at 4, as the published models use.
"""

from engine.config import Family
from engine.models.common import Transformer


class Model(Transformer):
    """A SmolLM3 model."""

    family = Family(rope_neox=False, no_rope_every=4)
