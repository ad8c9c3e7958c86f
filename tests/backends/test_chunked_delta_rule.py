"""The delta rule's chunked form on the cpu (cpu_kernels/delta_net.c) and MLX backends: a pass
over more than three chunks gives the outputs and the state of the rule token by token
(NumPy's `delta_rule.recurrent`, and the same backend fed one token a pass), within a bound
that is rounding alone (1e-4 of the largest value: the two forms add in other orders).

Head sizes 32 and 12 (not a whole number of 8-float vectors: the kernels' tail columns), chunks
of 16 and of 64 (Qwen3.5's), and a last chunk that is a part of one."""

import importlib.util

import numpy as np
import pytest

from backends import delta_rule
from backends.base import DeltaNetLayer, RecurrentState
from backends.cpu_backend import CpuBackend

HK, HV, K = 2, 4, 4
BOUND = 1e-4  # of the largest value of what is compared
CASES = [(32, 16, 70), (12, 16, 40), (32, 64, 150)]  # head size, chunk, tokens


def backend_named(name: str):
    """The backend, and how a NumPy array becomes one of its tensors."""
    if name == "cpu":
        return CpuBackend(threads=2), np.asarray
    if importlib.util.find_spec("mlx") is None:
        pytest.skip("mlx is not installed")
    import mlx.core as mx

    from backends.mlx_backend import MLXBackend

    return MLXBackend(), mx.array


def settings(head_dim: int, chunk: int) -> DeltaNetLayer:
    """One layer's settings: decays from mild to strong across the heads."""
    a = -np.linspace(0.5, 4.0, HV).astype(np.float32)
    return DeltaNetLayer(HK, HV, head_dim, a, np.linspace(-0.5, 0.5, HV).astype(np.float32), chunk=chunk)


def inputs(head_dim: int, tokens: int):
    """x (T, C), alpha and beta (T, Hv), and a starting state (Hv, Dh, Dh), seeded."""
    rng = np.random.default_rng(head_dim + tokens)
    x = rng.standard_normal((tokens, (2 * HK + HV) * head_dim)).astype(np.float32)
    alpha, beta = (rng.standard_normal((tokens, HV)).astype(np.float32) for _ in range(2))
    return x, alpha, beta, (0.1 * rng.standard_normal((HV, head_dim, head_dim))).astype(np.float32)


def state_with(backend, head_dim: int, start: np.ndarray):
    """A state of one Gated DeltaNet layer on `backend` holding `start` as its matrices."""
    state = backend.allocate_state([RecurrentState(((K - 1, (2 * HK + HV) * head_dim), (HV, head_dim, head_dim)))])
    arrays = backend.state_arrays(state)
    arrays[0][...] = 0.0
    arrays[1][...] = start
    backend.load_state_arrays(state, arrays)
    return state


def matrices(backend, state) -> np.ndarray:
    """The state's (Hv, Dh, Dh) matrices, on the host."""
    return np.array(backend.state_arrays(state)[1])


@pytest.mark.parametrize("name", ["cpu", "mlx"])
@pytest.mark.parametrize(("head_dim", "chunk", "tokens"), CASES)
def test_a_chunked_pass_equals_the_rule_token_by_token(name, head_dim, chunk, tokens):
    backend, put = backend_named(name)
    layer = settings(head_dim, chunk)
    x, alpha, beta, start = inputs(head_dim, tokens)
    want_state = start.copy()
    want = delta_rule.recurrent(*delta_rule.prepare(x, alpha, beta, layer), want_state).reshape(tokens, -1)
    state = state_with(backend, head_dim, start)
    got = backend.to_host(backend.delta_net(put(x), put(alpha), put(beta), layer, [state], 0))
    np.testing.assert_allclose(got, want, rtol=0, atol=BOUND * np.abs(want).max())
    np.testing.assert_allclose(matrices(backend, state), want_state, rtol=0, atol=BOUND * np.abs(want_state).max())


@pytest.mark.parametrize("name", ["cpu", "mlx"])
def test_a_chunked_pass_equals_the_same_backend_one_token_a_pass(name):
    backend, put = backend_named(name)
    head_dim, chunk, tokens = CASES[-1]
    layer = settings(head_dim, chunk)
    x, alpha, beta, start = inputs(head_dim, tokens)
    chunked, stepped = state_with(backend, head_dim, start), state_with(backend, head_dim, start)
    whole = backend.to_host(backend.delta_net(put(x), put(alpha), put(beta), layer, [chunked], 0))
    rows = [
        backend.to_host(
            backend.delta_net(put(x[t : t + 1]), put(alpha[t : t + 1]), put(beta[t : t + 1]), layer, [stepped], 0)
        )
        for t in range(tokens)
    ]
    one_by_one = np.concatenate(rows)  # (T, Hv * Dh)
    np.testing.assert_allclose(whole, one_by_one, rtol=0, atol=BOUND * np.abs(one_by_one).max())
    want_state = matrices(backend, stepped)
    np.testing.assert_allclose(matrices(backend, chunked), want_state, rtol=0, atol=BOUND * np.abs(want_state).max())
