"""Attention over a float16 KV cache (`backends/cuda/attention_ops.py`) on the CPU emulator,
against the NumPy backend's `attention` over an f16 state fed the same passes: a prefill
then decode steps, GQA, a windowed ring, softcap, sinks, bidirectional layers, and batched
decoding over several caches. Also in reverse and shuffled thread orders, which expose a
missing barrier."""

from dataclasses import dataclass

import numpy as np
import pytest

from backends.base import AttentionState, LayerAttention
from backends.cuda.attention_ops import Attention, LayerCache
from backends.cuda.device import Device
from backends.numpy_backend import NumpyBackend
from tests.backends.cuda.emulated import ORDERS, emulator

REFERENCE = NumpyBackend(memory_budget_bytes=0)


@dataclass(frozen=True)
class Case:
    """A layer and the lengths of the passes run over it."""

    heads: int
    kv_heads: int
    head_dim: int
    value_dim: int
    slots: int
    passes: tuple[int, ...]
    window: int | None = None
    ring: bool = False
    softcap: float | None = None
    sinks: bool = False
    causal: bool = True


CASES = {
    # prefill then decoding over a cache long enough to split the decode among blocks
    "prefill_decode": Case(4, 2, 64, 64, 300, (150, 1, 100, 1, 1)),
    # eight query heads on one KV head (two decode blocks of four), keys wider than values
    "gqa_wide_keys": Case(8, 1, 128, 64, 64, (20, 1, 1)),
    # three heads a KV head (SmolLM2), with a window over a full cache
    "gqa3_window": Case(6, 2, 64, 64, 200, (70, 1, 60, 1), window=24),
    # a ring: the window's positions wrap around 24 slots, passes as long as the ring allows
    "ring": Case(4, 2, 64, 64, 24, (9, 9, 1, 1, 9, 5, 1, 9, 1), window=16, ring=True),
    # Gemma 2's softcap and gpt-oss's sinks
    "softcap_sinks": Case(4, 1, 128, 128, 160, (33, 1, 1, 40, 1), softcap=20.0, sinks=True),
    # bidirectional, with and without a symmetric window
    "bidirectional": Case(2, 1, 64, 64, 80, (25, 30, 1), causal=False),
    "bidirectional_window": Case(2, 2, 64, 64, 80, (40, 1), window=5, causal=False),
    # Gemma 3's 256-wide heads (the widest prefill tiles) with a window; Phi-3's 96 (not a power of two)
    "gemma_heads": Case(4, 1, 256, 256, 100, (40, 1, 1), window=32),
    "phi3_heads": Case(2, 2, 96, 96, 50, (17, 1)),
    # heads too wide for the prefill tiles (Gemma 4's 512): a prefill through the decode kernel
    "wide_heads": Case(2, 1, 512, 512, 64, (20, 1)),
}


def _state(case: Case) -> AttentionState:
    """The reference's layer state: a ring where the case has one, else every position kept."""
    window = case.window if case.ring else None
    return AttentionState(case.kv_heads, case.head_dim, case.value_dim, case.slots, window, kv_type="f16")


def _cache(dev, case: Case) -> LayerCache:
    keys = dev.alloc(2 * case.kv_heads * case.slots * case.head_dim)
    values = dev.alloc(2 * case.kv_heads * case.slots * case.value_dim)
    dev.memset(keys, 0, 2 * case.kv_heads * case.slots * case.head_dim)
    dev.memset(values, 0, 2 * case.kv_heads * case.slots * case.value_dim)
    return LayerCache(keys, values, case.kv_heads, case.slots, case.head_dim, case.value_dim, case.ring)


def _settings(case: Case, rng: np.random.Generator) -> LayerAttention:
    sinks = rng.standard_normal(case.heads).astype(np.float32) if case.sinks else None
    return LayerAttention(case.head_dim**-0.5, case.window, case.softcap, sinks, case.causal)


def _qkv(case: Case, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    q = (rng.standard_normal((n, case.heads, case.head_dim)) * 2).astype(np.float32)  # (T, H, Dh)
    k = rng.standard_normal((n, case.kv_heads, case.head_dim)).astype(np.float32)  # (T, Hkv, Dh)
    v = rng.standard_normal((n, case.kv_heads, case.value_dim)).astype(np.float32)  # (T, Hkv, Dv)
    return q, k, v


def _device_pass(dev, ops: Attention, cache: LayerCache, case: Case, settings, q, k, v, start: int) -> np.ndarray:
    """Write k and v and attend q on the device, as one backend pass would: (T, H * Dv)."""
    n = len(q)
    positions = dev.to_device(np.arange(start, start + n, dtype=np.int32))
    sinks = dev.to_device(settings.sinks) if settings.sinks is not None else 0
    out = dev.alloc(4 * n * case.heads * case.value_dim)
    ops.write(dev.to_device(k), dev.to_device(v), n, cache, positions)
    ops.attend(
        dev.to_device(q), n, case.heads, cache, positions, settings.scale, settings.window, settings.softcap,
        sinks, settings.causal, out,
    )  # fmt: skip
    return dev.from_device(out, (n, case.heads * case.value_dim), np.float32)


def _run(case: Case, dev: Device) -> None:
    ops = Attention(dev)
    rng = np.random.default_rng(sum(case.passes))
    settings = _settings(case, rng)
    cache = _cache(dev, case)
    state = REFERENCE.allocate_state([_state(case)])
    start = 0
    for n in case.passes:
        q, k, v = _qkv(case, n, rng)
        want = REFERENCE.attention(q, k, v, state, 0, start, settings)
        got = _device_pass(dev, ops, cache, case, settings, q, k, v, start)
        np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4, err_msg=f"pass of {n} at {start}")
        start += n
    shape = (case.kv_heads, case.slots)
    stored_keys = dev.from_device(cache.keys, (*shape, case.head_dim), np.float16)
    stored_values = dev.from_device(cache.values, (*shape, case.value_dim), np.float16)
    np.testing.assert_array_equal(stored_keys, state.keys[0])  # the same float16 roundings, bit for bit
    np.testing.assert_array_equal(stored_values, state.values[0])
    ops.close()


@pytest.mark.parametrize("name", list(CASES))
def test_attention_matches_numpy(name, device):
    _run(CASES[name], device)


@pytest.mark.parametrize("order", ORDERS[1:])
@pytest.mark.parametrize("name", ["prefill_decode", "ring", "softcap_sinks"])
def test_attention_in_other_thread_orders(name, order):
    dev = emulator(order)
    _run(CASES[name], dev)
    dev.close()


@pytest.mark.parametrize("order", ORDERS)
def test_attend_batch_over_several_caches(order):
    """Three sequences at different lengths (one a fresh cache of another size), one token each."""
    base = Case(4, 2, 64, 64, 200, ())
    cases = [base, base, Case(4, 2, 64, 64, 100, ())]
    prefills = (130, 7, 60)
    dev = emulator(order)
    ops = Attention(dev)
    rng = np.random.default_rng(5)
    settings = LayerAttention(0.125, softcap=15.0)
    caches = [_cache(dev, case) for case in cases]
    states = [REFERENCE.allocate_state([_state(case)]) for case in cases]
    for case, cache, state, n in zip(cases, caches, states, prefills, strict=True):
        q, k, v = _qkv(case, n, rng)
        REFERENCE.attention(q, k, v, state, 0, 0, settings)
        _device_pass(dev, ops, cache, case, settings, q, k, v, 0)
    for _ in range(2):  # two steps: the second reuses the batch's table of caches
        q, k, v = _qkv(base, len(cases), rng)
        want = REFERENCE.attention_batch(q, k, v, states, 0, list(prefills), settings)
        positions = dev.to_device(np.array(prefills, dtype=np.int32))
        for row, cache in enumerate(caches):
            ops.write(dev.to_device(k[row : row + 1]), dev.to_device(v[row : row + 1]), 1, cache, positions + 4 * row)
        out = dev.alloc(4 * len(cases) * base.heads * base.value_dim)
        ops.attend_batch(
            dev.to_device(q), len(cases), base.heads, caches, positions, settings.scale, None, settings.softcap, 0, out
        )
        got = dev.from_device(out, want.shape, np.float32)
        np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4)
        prefills = tuple(p + 1 for p in prefills)
    ops.close()
    dev.close()


def test_recorded_decode_step_replays_at_the_next_position(device):
    """A decode step recorded once reads its position from device memory: replayed after the
    host writes the next position (and the next token's q, k, v), it attends there."""
    case = Case(4, 2, 64, 64, 300, ())
    dev = device
    ops = Attention(dev)
    rng = np.random.default_rng(9)
    settings = LayerAttention(0.125, window=40)
    cache = _cache(dev, case)
    state = REFERENCE.allocate_state([_state(case)])
    q, k, v = _qkv(case, 150, rng)
    REFERENCE.attention(q, k, v, state, 0, 0, settings)
    _device_pass(dev, ops, cache, case, settings, q, k, v, 0)
    q, k, v = _qkv(case, 1, rng)
    buffers = [dev.to_device(a) for a in (q, k, v)]
    position = dev.to_device(np.array([150], dtype=np.int32))
    out = dev.alloc(4 * case.heads * case.value_dim)
    dev.begin_capture()
    ops.write(buffers[1], buffers[2], 1, cache, position)
    ops.attend(buffers[0], 1, case.heads, cache, position, settings.scale, settings.window, None, 0, True, out)
    step = dev.end_capture()
    for at in range(150, 153):
        if at > 150:
            q, k, v = _qkv(case, 1, rng)
            for buffer, host in zip(buffers, (q, k, v), strict=True):
                dev.upload(buffer, host)
            dev.upload(position, np.array([at], dtype=np.int32))
        step.replay()
        want = REFERENCE.attention(q, k, v, state, 0, at, settings)
        np.testing.assert_allclose(dev.from_device(out, want.shape, np.float32), want, rtol=1e-3, atol=1e-4)
    ops.close()
