"""The norms, rope and elementwise kernels (`backends/cuda/pointwise.py`)
on each test device (the CPU emulator; a GPU where one runs),
against the NumPy backend's ops."""

import numpy as np
import pytest

from backends.cuda.pointwise import Pointwise
from backends.numpy_backend import NumpyBackend

REFERENCE = NumpyBackend(memory_budget_bytes=0)
RNG = np.random.default_rng(7)


@pytest.fixture(scope="module")
def dev(device):
    """The device of this run (the emulator, then a GPU where one runs: conftest.py)."""
    return device


@pytest.fixture(scope="module")
def ops(dev):
    return Pointwise(dev)


def _random(*shape: int, scale: float = 1.0) -> np.ndarray:
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def _close(got: np.ndarray, want: np.ndarray) -> None:
    """Equal to float32 rounding: relative, and absolute on the scale of the largest value (silu and gelu of
    negative inputs cancel, 1 + tanh(x) near zero, in the reference as in the kernel)."""
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-7 * max(10.0, float(np.abs(want).max())))


@pytest.mark.parametrize("dim", [64, 1536])  # a warp per row, a block per row
@pytest.mark.parametrize("in_place", [False, True])
def test_rms_norm(dev, ops, dim, in_place):
    x, w = _random(5, dim, scale=3.0), _random(dim)
    xp, wp = dev.to_device(x), dev.to_device(w)
    out = xp if in_place else dev.alloc(x.nbytes)
    ops.rms_norm(xp, 5, dim, wp, 1e-6, out)
    _close(dev.from_device(out, x.shape, np.float32), REFERENCE.rms_norm(x, w, 1e-6))


@pytest.mark.parametrize("dim", [96, 2048])
@pytest.mark.parametrize("with_bias", [False, True])
def test_layer_norm(dev, ops, dim, with_bias):
    x, w, b = _random(3, dim, scale=2.0) + 1.5, _random(dim), _random(dim)
    xp, wp = dev.to_device(x), dev.to_device(w)
    bp = dev.to_device(b) if with_bias else 0
    ops.layer_norm(xp, 3, dim, wp, bp, 1e-5, xp)
    want = REFERENCE.layer_norm(x, w, b if with_bias else None, 1e-5)
    _close(dev.from_device(xp, x.shape, np.float32), want)


def test_add_scale_softcap(dev, ops):
    n = 1000
    a, b = _random(n, scale=20.0), _random(n)
    ap, bp, out = dev.to_device(a), dev.to_device(b), dev.alloc(4 * n)
    ops.add(ap, bp, n, out)
    _close(dev.from_device(out, (n,), np.float32), REFERENCE.add(a, b))
    ops.scale(ap, n, 0.375, out)
    _close(dev.from_device(out, (n,), np.float32), REFERENCE.scale(a, 0.375))
    ops.softcap(ap, n, 30.0, ap)  # in place
    _close(dev.from_device(ap, (n,), np.float32), REFERENCE.softcap(a, 30.0))


@pytest.mark.parametrize("kind", ["silu", "gelu_tanh"])
def test_activation(dev, ops, kind):
    x = _random(777, scale=4.0)
    xp = dev.to_device(x)
    ops.activation(xp, x.size, kind, xp)
    _close(dev.from_device(xp, x.shape, np.float32), REFERENCE.activation(x, kind))


@pytest.mark.parametrize("kind", ["silu", "gelu_tanh", "sigmoid", "swiglu_oai"])
def test_gated(dev, ops, kind):
    gate, up = _random(4, 300, scale=5.0), _random(4, 300, scale=5.0)  # beyond swiglu_oai's clamps too
    gp, up_ptr, out = dev.to_device(gate), dev.to_device(up), dev.alloc(up.nbytes)
    ops.gated(gp, up_ptr, 4, 300, kind, out)
    _close(dev.from_device(out, up.shape, np.float32), REFERENCE.gated_activation(gate, up, kind))


def test_sigmoid_gate_per_row(dev, ops):
    gate, up = _random(6, 1, scale=3.0), _random(6, 128)
    gp, up_ptr = dev.to_device(gate), dev.to_device(up)
    ops.gated(gp, up_ptr, 6, 128, "sigmoid", up_ptr, gate_cols=1)  # in place over up
    _close(dev.from_device(up_ptr, up.shape, np.float32), REFERENCE.gated_activation(gate, up, "sigmoid"))


@pytest.mark.parametrize(
    ("neox", "head_dim", "rope_dim", "factors", "mscale", "base"),
    [
        (False, 64, 64, False, 1.0, 10000.0),  # Llama's adjacent pairs
        (True, 128, 128, False, 1.0, 1000000.0),  # Qwen's halves
        (True, 64, 32, True, 1.2, 500000.0),  # a partial rotation, frequency factors, YaRN's mscale
        (False, 96, 48, False, 1.0, 10000.5),  # a base that float32 cannot hold exactly
    ],
)
@pytest.mark.parametrize("in_place", [False, True])
def test_rope(dev, ops, neox, head_dim, rope_dim, factors, mscale, base, in_place):
    t, heads = 3, 5
    x = _random(t, heads, head_dim)
    positions = np.array([0, 17, 40000], dtype=np.int32)  # a long position: its angle needs double precision
    freq = (RNG.uniform(1.0, 8.0, rope_dim // 2)).astype(np.float32) if factors else None
    xp, pp = dev.to_device(x), dev.to_device(positions)
    fp = dev.to_device(freq) if freq is not None else 0
    out = xp if in_place else dev.alloc(x.nbytes)
    ops.rope(xp, t, heads, head_dim, pp, base, rope_dim, neox, fp, mscale, out)
    want = REFERENCE.rope(x, positions, base, rope_dim, neox, freq, mscale)
    np.testing.assert_allclose(dev.from_device(out, x.shape, np.float32), want, rtol=1e-5, atol=2e-6)
