"""The backend registry: every backend is an entry that starts or says why not, with the
memory rule the app estimates by."""

import importlib.util
from dataclasses import replace

import pytest

from backends.cuda.probe import probe, unavailable_reason
from backends.errors import BackendUnavailable
from backends.memory import DEQUANTIZED_WEIGHTS, MAPPED_WEIGHTS, RUNTIME_OVERHEAD, Footprint
from backends.numpy_backend import NumpyBackend
from backends.selection import PREFERENCES, REGISTRY, entry, planned_backend, select


def test_every_backend_the_settings_offer_is_an_entry_cuda_included():
    assert [e.name for e in REGISTRY] == ["cuda", "mlx", "cpu", "numpy"]
    assert PREFERENCES == ("auto", "cuda", "mlx", "cpu", "numpy")


def test_cuda_says_why_it_cannot_run_in_the_probes_words(monkeypatch):
    monkeypatch.delenv("SPRIG_CUDA_DEVICE", raising=False)
    reason = unavailable_reason(probe())
    if reason is None:
        pytest.skip("this machine can run CUDA: there is no reason to show")
    with pytest.raises(BackendUnavailable) as refused:
        select("cuda")
    assert str(refused.value) == reason and reason.startswith("cuda: ")
    backend, reasons = select("auto")
    backend.close()
    assert reasons[0] == reason


def test_the_emulator_runs_only_when_cuda_is_asked_for_by_name(monkeypatch):
    monkeypatch.setenv("SPRIG_CUDA_DEVICE", "emulator")
    backend, reasons = select("cuda")
    try:
        assert backend.name == "cuda" and "emulator" in backend.device_name.lower() and reasons == []
    finally:
        backend.close()
    backend, reasons = select("auto")
    backend.close()
    assert backend.name != "cuda"
    assert reasons[0] == "cuda: SPRIG_CUDA_DEVICE=emulator runs only when the cuda backend is chosen"


def test_an_unknown_backend_is_refused_by_name():
    with pytest.raises(BackendUnavailable, match=r"unknown backend 'tpu'.*auto, cuda, mlx, cpu, numpy"):
        select("tpu")


def test_auto_plans_the_backend_it_starts():
    backend, _ = select("auto")
    try:
        assert planned_backend("auto") == backend.name
    finally:
        backend.close()


def test_each_backend_owns_the_rule_its_entry_gives_the_app():
    assert NumpyBackend.memory_rule is entry("numpy").memory_rule is DEQUANTIZED_WEIGHTS
    from backends.cpu_backend import CpuBackend

    assert CpuBackend.memory_rule is entry("cpu").memory_rule is MAPPED_WEIGHTS
    if importlib.util.find_spec("mlx") is None:
        print("mlx is not installed: its class's rule is not compared")
        return
    from backends.mlx_backend import MLXBackend

    assert MLXBackend.memory_rule is entry("mlx").memory_rule


def test_memory_rules_worked_by_hand():
    model = Footprint(
        file_bytes=100_000_000, f32_weight_bytes=400_000_000, kv_bytes_per_position=1000, context_length=2048,
        kv_type="f32",
    )
    # the cpu rule: the mapped file, the KV cache (at most the model's context) and the overhead
    assert MAPPED_WEIGHTS.needed(model, 4096) == 100_000_000 + 2048 * 1000 + RUNTIME_OVERHEAD
    # a float16 cache holds 2 bytes a value, Q8_0 34 bytes per 32 values (of float32's 128)
    assert MAPPED_WEIGHTS.needed(replace(model, kv_type="f16"), 4096) == 100_000_000 + 2048 * 500 + RUNTIME_OVERHEAD
    assert MAPPED_WEIGHTS.needed(replace(model, kv_type="q8_0"), 4096) == 100_000_000 + 2048 * 265 + RUNTIME_OVERHEAD
    plan = MAPPED_WEIGHTS.plan(model, 1000, available=300_000_000)
    assert (plan.fits, plan.runs) == (False, True) and "will not fit" in plan.caveat
    # NumPy: float32 copies within half the memory available, else dequantized on every step
    assert DEQUANTIZED_WEIGHTS.needed(model, 1000) == 400_000_000 + 1_000_000
    assert DEQUANTIZED_WEIGHTS.plan(model, 1000, available=900_000_000).fits
    slow = DEQUANTIZED_WEIGHTS.plan(model, 1000, available=500_000_000)
    assert (slow.fits, slow.runs) == (False, True) and "slowly" in slow.caveat
    assert not DEQUANTIZED_WEIGHTS.plan(model, 1000, available=50_000_000).runs
