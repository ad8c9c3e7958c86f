"""The CUDA backend's per-sequence state gives its device memory back: when the conversation
that held it is dropped, and at the latest when the backend closes."""

import gc

from backends.base import AttentionState
from backends.cuda.backend import CudaBackend
from tests.backends.cuda.emulated import emulator

LAYERS = [AttentionState(2, 64, 64, 32, kv_type="f16"), AttentionState(2, 64, 64, 32, kv_type="f16")]


def _backend_counting_frees() -> tuple[CudaBackend, list[int]]:
    device = emulator()
    freed: list[int] = []
    release = device.free
    device.free = lambda ptr: (freed.append(ptr), release(ptr))[1]  # type: ignore[method-assign]
    return CudaBackend(device), freed


def test_a_dropped_state_frees_its_keys_and_values():
    backend, freed = _backend_counting_frees()
    state = backend.allocate_state(LAYERS)
    held = {ptr for cache in state.caches if cache is not None for ptr in (cache.keys, cache.values)}
    assert len(held) == 4
    del state
    gc.collect()
    assert held <= set(freed)
    backend.close()
    assert sorted(freed).count(min(held)) == 1  # freed once, not again at close


def test_close_frees_the_states_still_held():
    backend, freed = _backend_counting_frees()
    state = backend.allocate_state(LAYERS)
    held = {ptr for cache in state.caches if cache is not None for ptr in (cache.keys, cache.values)}
    backend.close()
    assert held <= set(freed)
    del state
    gc.collect()
    assert all(freed.count(ptr) == 1 for ptr in held)
