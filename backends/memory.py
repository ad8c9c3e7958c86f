"""How much memory a model needs on a backend, worked out before anything is loaded.

Each backend has a memory rule (`Backend.memory_rule`, and the same rule in its entry of
`backends.selection.REGISTRY`, so that the app can ask without starting the backend):
what a model of a given `Footprint` needs with a KV cache of n positions, and whether that
fits the memory available. The app's model picker and its load check ask the rule of the
backend they plan to use.
"""

from dataclasses import dataclass

import psutil

from backends.kv_types import DEFAULT_KV_TYPE, kv_row_bytes

RUNTIME_OVERHEAD = 256 * 1024 * 1024
"""Beyond weights and KV cache: tokenizer, Python, Qt and the kernels' buffers. Measured on
Linux with SmolLM2 on the cpu backend: 315 MB resident over a bare `import engine` for a
98 MB file (Gemma's 262k-token vocabulary adds more)."""
CACHE_FRACTION = 0.5  # of the memory available, that the NumPy backend's float32 copies may fill


def available_memory_bytes() -> int:
    """Memory the OS could give us now."""
    return psutil.virtual_memory().available


def default_cache_budget(available: int) -> int:
    """How much of `available` memory the NumPy backend's dequantization cache may fill."""
    return int(available * CACHE_FRACTION)


@dataclass(frozen=True)
class Footprint:
    """A model's size as its file's header tells it, and the KV type its cache will store."""

    file_bytes: int
    f32_weight_bytes: int  # every matrix as float32
    kv_bytes_per_position: int  # float32 keys and values of every layer, for one position
    context_length: int  # the most positions a KV cache holds
    kv_type: str = DEFAULT_KV_TYPE  # what the cache stores them as (`backends.kv_types`)

    def kv_bytes(self, n_ctx: int) -> int:
        """Bytes of a KV cache of `n_ctx` positions (at most the model's context), as
        `kv_type` stores them: float32's bytes times the type's bytes per 32 values over
        128 (f16 64/128, Q8_0 34/128)."""
        per_position = self.kv_bytes_per_position * kv_row_bytes(self.kv_type, 32) // kv_row_bytes("f32", 32)
        return per_position * min(n_ctx, self.context_length)


@dataclass(frozen=True)
class MemoryPlan:
    """A backend's answer for one model: the bytes it needs, whether they fit, whether it
    can run at all (the file's pages and the KV cache fit), and what the user should know
    when it does not fit as planned."""

    needed: int
    fits: bool
    runs: bool
    caveat: str = ""


class MemoryRule:
    """Weights read where they lie in the memory-mapped file (cpu, MLX): the file, the KV
    cache and the fixed overhead."""

    def needed(self, model: Footprint, n_ctx: int) -> int:
        """Bytes a load needs with a KV cache of `n_ctx` positions."""
        return model.file_bytes + model.kv_bytes(n_ctx) + RUNTIME_OVERHEAD

    def plan(self, model: Footprint, n_ctx: int, available: int) -> MemoryPlan:
        """What a load with a KV cache of `n_ctx` positions needs against `available` bytes."""
        needed = self.needed(model, n_ctx)
        runs = model.file_bytes + model.kv_bytes(n_ctx) <= available
        if needed <= available:
            return MemoryPlan(needed, True, runs)
        return MemoryPlan(needed, False, runs, "it will not fit; choose a smaller model or a shorter context")


class DequantizedWeights(MemoryRule):
    """Weights held as float32 copies within a budget (NumPy): a model whose copies fit the
    budget runs at full speed; a larger one dequantizes on every step, slowly."""

    def needed(self, model: Footprint, n_ctx: int) -> int:
        return model.f32_weight_bytes + model.kv_bytes(n_ctx)

    def plan(self, model: Footprint, n_ctx: int, available: int) -> MemoryPlan:
        needed = self.needed(model, n_ctx)
        runs = model.file_bytes + model.kv_bytes(n_ctx) <= available
        if needed <= default_cache_budget(available):
            return MemoryPlan(needed, True, runs)
        if runs:
            return MemoryPlan(needed, False, runs, "it will run, slowly, dequantizing weights on every step")
        return MemoryPlan(needed, False, runs, "it will not fit; choose a smaller model or a shorter context")


MAPPED_WEIGHTS = MemoryRule()
DEQUANTIZED_WEIGHTS = DequantizedWeights()
