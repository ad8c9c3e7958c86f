"""The cpu kernels of the Gated DeltaNet (cpu_kernels/delta_net.c) and the sigmoid gate,
against the NumPy reference (backends/delta_rule.py) on random inputs and states: a decode
step, a prefill of more than two chunks, and a batch of sequences, with value heads sharing
key heads as llama.cpp orders them."""

import numpy as np
import pytest

from backends import delta_rule
from backends.base import DeltaNetLayer, RecurrentState
from backends.cpu_backend import CpuBackend
from backends.numpy_backend import NumpyBackend

HK, HV, DH, K = 2, 4, 32, 4
C = (2 * HK + HV) * DH
SETTINGS = DeltaNetLayer(
    HK, HV, DH, -np.linspace(1.0, 6.0, HV).astype(np.float32), np.linspace(-0.5, 0.5, HV).astype(np.float32), chunk=16
)


def states(backend, n: int, rng):
    """n states of one Gated DeltaNet layer, filled with the same random arrays on any backend."""
    layout = [RecurrentState(((K - 1, C), (HV, DH, DH)))]
    made = [backend.allocate_state(layout) for _ in range(n)]
    for b, state in enumerate(made):
        fill = np.random.default_rng(b)
        state.arrays[0][0][...] = fill.standard_normal((K - 1, C))
        state.arrays[0][1][...] = 0.1 * fill.standard_normal((HV, DH, DH))
    return made


@pytest.mark.parametrize(("tokens", "n_states"), [(1, 1), (40, 1), (3, 3)])
def test_short_conv_and_delta_net_equal_the_reference(tokens, n_states):
    rng = np.random.default_rng(5)
    x = rng.standard_normal((tokens, C)).astype(np.float32)
    alpha, beta = (rng.standard_normal((tokens, HV)).astype(np.float32) for _ in range(2))
    kernel = rng.standard_normal((C, K)).astype(np.float32)
    cpu, ref = CpuBackend(threads=2), NumpyBackend()
    got_states, want_states = states(cpu, n_states, rng), states(ref, n_states, rng)
    got = cpu.delta_net(cpu.short_conv(x, kernel, got_states, 0), alpha, beta, SETTINGS, got_states, 0)
    want = ref.delta_net(ref.short_conv(x, kernel, want_states, 0), alpha, beta, SETTINGS, want_states, 0)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-4 * np.abs(want).max())
    for mine, theirs in zip(got_states, want_states, strict=True):
        np.testing.assert_array_equal(mine.arrays[0][0], theirs.arrays[0][0])  # the newest inputs
        np.testing.assert_allclose(mine.arrays[0][1], theirs.arrays[0][1], rtol=0, atol=1e-5)


def test_the_chunked_reference_equals_its_token_by_token_form():
    rng = np.random.default_rng(9)
    x, alpha, beta = (rng.standard_normal(shape).astype(np.float32) for shape in ((70, C), (70, HV), (70, HV)))
    q, k, v, g, b = delta_rule.prepare(x, alpha, beta, SETTINGS)
    start = (0.1 * rng.standard_normal((HV, DH, DH))).astype(np.float32)
    chunked_state, stepped_state = start.copy(), start.copy()
    chunked = delta_rule.chunked(q, k, v, g, b, chunked_state, 16)  # 4 chunks and a part
    stepped = delta_rule.recurrent(q, k, v, g, b, stepped_state)
    np.testing.assert_allclose(chunked, stepped, rtol=0, atol=1e-5)
    np.testing.assert_allclose(chunked_state, stepped_state, rtol=0, atol=1e-5)


@pytest.mark.parametrize("gate_width", [1, 6])
def test_the_sigmoid_gate(gate_width):
    rng = np.random.default_rng(3)
    gate, up = rng.standard_normal((5, gate_width)).astype(np.float32), rng.standard_normal((5, 6)).astype(np.float32)
    got = CpuBackend(threads=1).gated_activation(gate, up, "sigmoid")
    np.testing.assert_allclose(got, up / (1.0 + np.exp(-gate)), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize(("channels", "tokens"), [(19, 1), (19, 7), (43, 2)])
def test_short_conv_on_channels_that_are_not_whole_vectors(channels, tokens):
    """The kernel runs 8 channels at a time: the last few of each thread's part are a partial vector."""
    rng = np.random.default_rng(channels + tokens)
    x = rng.standard_normal((tokens, channels)).astype(np.float32)
    kernel = rng.standard_normal((channels, K)).astype(np.float32)
    start = rng.standard_normal((K - 1, channels)).astype(np.float32)
    cpu = CpuBackend(threads=2)
    state = cpu.allocate_state([RecurrentState(((K - 1, channels), (1, 1, 1)))])
    state.arrays[0][0][...] = start
    want_window = start.copy()
    want = delta_rule.short_conv(x, kernel, want_window)
    got = cpu.short_conv(x, kernel, [state], 0)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(state.arrays[0][0], want_window)
