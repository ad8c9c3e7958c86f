"""RoPE scaling for longer contexts, as the rope op takes it: a divisor per frequency, and
a factor on the rotated features.

- Linear (position interpolation): every frequency divided by the factor.
- YaRN (gpt-oss, and the long-context Qwens): frequencies that turn many times within the
  original context keep their value (extrapolation), slow ones are divided by the factor
  (interpolation), with a linear ramp between; the rotated features of queries and keys are
  both scaled by 1 + 0.1 ln(factor) (`mscale`, as cos and sin are in llama.cpp). The ramp's ends are rounded outwards to
  whole dimensions, as llama.cpp does (ggml_rope_yarn_corr_dims); transformers does the
  same unless a config says `truncate: false`.
"""

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class LayerRope:
    """How one layer rotates its queries and keys."""

    base: float
    freq_factors: np.ndarray | None = None
    mscale: float = 1.0  # what the rotated features are multiplied by (YaRN, LongRoPE)


def linear_divisors(rope_dim: int, factor: float) -> np.ndarray:
    """Linear scaling: (rope_dim / 2,) divisors, all `factor`."""
    return np.full(rope_dim // 2, factor, dtype=np.float32)


def yarn_divisors(
    rope_dim: int, base: float, factor: float, original_context: int, beta_fast: float, beta_slow: float
) -> np.ndarray:
    """YaRN's frequency divisors (rope_dim / 2,): 1 where a frequency is extrapolated,
    `factor` where it is interpolated, a linear mix between."""

    def dimension(rotations: float) -> float:  # the dimension whose frequency turns `rotations` times
        return rope_dim * math.log(original_context / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low = max(0.0, math.floor(dimension(beta_fast)))
    high = min(rope_dim - 1.0, math.ceil(dimension(beta_slow)))
    pair = np.arange(rope_dim // 2, dtype=np.float64)
    extrapolated = 1.0 - np.clip((pair - low) / max(0.001, high - low), 0.0, 1.0)  # share kept as it is
    return (1.0 / ((1.0 - extrapolated) / factor + extrapolated)).astype(np.float32)


def yarn_mscale(factor: float) -> float:
    """What YaRN multiplies the rotated features of queries and keys by."""
    return 1.0 + 0.1 * math.log(factor) if factor > 1.0 else 1.0
