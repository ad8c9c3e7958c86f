"""Will a model fit this machine? Decided from sizes alone, before anything is downloaded.

The memory a model needs is its file (read in place by the native backends), its KV
cache at the chosen context, and a fixed overhead; the caller computes it with the
same rule the model picker uses, from the file's header when it is cached, else from
the estimates here. The verdict compares that with the memory free now:
fits (with a fifth to spare), tight (fits, barely), or won't fit.
"""

import math
from dataclasses import dataclass

import gguf

from engine.hub.files import DEFAULT_QUANT, GGUFChoice

FITS, TIGHT, WONT_FIT = "fits", "tight", "won't fit"
COMFORT = 0.8  # "fits" leaves a fifth of the free memory to everything else
# Float32 K and V per position ≈ 3·√parameters; the real factor is 4.0 for SmolLM2, 4.7 for Qwen3-4B,
# 1.9 for Llama-3.2-1B and 1.3 for Qwen2.5-7B. Used only when no header is at hand.
KV_BYTES_PER_SQRT_PARAMETER = 3
UNKNOWN_BITS_PER_WEIGHT = 5.0


@dataclass(frozen=True)
class Fit:
    """A fit verdict: the level, the bytes needed and available, and whether they were estimated."""

    level: str  # FITS, TIGHT or WONT_FIT
    needed: int
    available: int
    estimated: bool

    @property
    def comfortable(self) -> bool:
        """Whether it fits with room to spare."""
        return self.level == FITS


def fit_level(needed: int, available: int) -> str:
    """FITS within COMFORT of `available`, TIGHT within all of it, else WONT_FIT."""
    if needed <= COMFORT * available:
        return FITS
    return TIGHT if needed <= available else WONT_FIT


def judge(needed: int, available: int, estimated: bool) -> Fit:
    """The verdict for a model that needs `needed` bytes where `available` are free."""
    return Fit(fit_level(needed, available), needed, available, estimated)


def bits_per_weight(quant: str) -> float:
    """Average bits per weight of a quantization name ("Q4_K_M" counts as Q4_K's 4.5)."""
    base = quant.upper().removesuffix("_XL").removesuffix("_XXS").removesuffix("_XS")
    for name in (quant.upper(), base, base.rsplit("_", 1)[0]):
        if name in gguf.GGMLQuantizationType.__members__:
            block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[name]]
            return 8 * size / block
    return UNKNOWN_BITS_PER_WEIGHT


def estimated_parameters(choice: GGUFChoice) -> int:
    """Parameters of a model from its file size and quantization (when the Hub does not say)."""
    return int(choice.size * 8 / bits_per_weight(choice.quant))


def estimated_kv_bytes_per_token(parameters: int) -> int:
    """Float32 keys and values per position, estimated from the parameter count (no header at hand)."""
    return int(KV_BYTES_PER_SQRT_PARAMETER * math.sqrt(parameters))


def recommended_choice(choices: tuple[GGUFChoice, ...], fits: dict[GGUFChoice, Fit]) -> GGUFChoice | None:
    """The largest choice that fits comfortably, no larger than the Q4_K_M where there is one.

    Q4_K_M is the usual balance of size and quality; larger files are the user's call.
    None if nothing fits comfortably.
    """
    default = [c.size for c in choices if c.quant == DEFAULT_QUANT]
    cap = min(default) if default else math.inf
    candidates = [c for c in choices if fits[c].comfortable and c.size <= cap]
    return max(candidates, key=lambda c: c.size) if candidates else None
