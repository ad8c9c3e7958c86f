"""The Gated DeltaNet's arithmetic in NumPy (Qwen3.5's linear attention): the short causal
convolution and the gated delta rule, token by token and in chunks.

The reference for `Backend.short_conv` and `Backend.delta_net`; float32 throughout. The
chunked form is transformers' `torch_chunk_gated_delta_rule`: within a chunk of L rows the
rule's L rank-one updates become one lower-triangular solve and a few matrix products, and
the state is carried from chunk to chunk; it gives the token-by-token numbers up to rounding.
"""

from collections.abc import Sequence
from typing import Any

import numpy as np

from backends.base import DeltaNetLayer


def row_groups(n_rows: int, n_states: int) -> list[slice]:
    """The rows of each state: all of them for one state, one each for several (batched decoding)."""
    if n_states == 1:
        return [slice(0, n_rows)]
    assert n_rows == n_states, (n_rows, n_states)
    return [slice(b, b + 1) for b in range(n_states)]


def short_conv(x: np.ndarray, weight: np.ndarray, window: np.ndarray) -> np.ndarray:
    """silu(causal depthwise convolution) of x (T, C) after `window` (K - 1, C), the inputs
    before it, which is then replaced by the last K - 1 inputs. weight (C, K). Returns (T, C)."""
    n, k = len(x), weight.shape[1]
    padded = np.concatenate([window, x])  # (K - 1 + T, C)
    out = np.zeros(x.shape, dtype=np.float32)
    for j in range(k):
        out += padded[j : j + n] * weight[:, j]  # (T, C)
    window[...] = padded[n:]
    return out / (np.float32(1.0) + np.exp(-out))


def _l2norm(x: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt((x * x).sum(axis=-1, keepdims=True) + np.float32(eps))


def prepare(
    x: np.ndarray, alpha: np.ndarray, beta: np.ndarray, s: DeltaNetLayer
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """q, k (T, Hv, Dh) normalised (q scaled), v (T, Hv, Dh), the log decay g and the write
    strength b (T, Hv), from the convolution's output x (T, C) and the projections alpha, beta."""
    n, width = len(x), s.k_heads * s.head_dim
    q = _l2norm(x[:, :width].reshape(n, s.k_heads, s.head_dim), s.eps)  # (T, Hk, Dh)
    k = _l2norm(x[:, width : 2 * width].reshape(n, s.k_heads, s.head_dim), s.eps)  # (T, Hk, Dh)
    v = x[:, 2 * width :].reshape(n, s.v_heads, s.head_dim)  # (T, Hv, Dh)
    repeat = s.v_heads // s.k_heads  # value head j reads key head j % Hk
    q = np.tile(q, (1, repeat, 1)) * np.float32(s.head_dim**-0.5)  # (T, Hv, Dh)
    k = np.tile(k, (1, repeat, 1))  # (T, Hv, Dh)
    g = s.a * np.logaddexp(np.float32(0.0), alpha + s.dt_bias)  # (T, Hv): a < 0, so g <= 0
    b = np.float32(1.0) / (np.float32(1.0) + np.exp(-beta))  # (T, Hv)
    return q, k, v, g.astype(np.float32), b.astype(np.float32)


def recurrent(q, k, v, g, b, state: np.ndarray) -> np.ndarray:
    """The rule token by token; state (Hv, Dh, Dh) updated in place. Returns (T, Hv, Dh)."""
    out = np.empty(v.shape, dtype=np.float32)
    for t in range(len(q)):
        state *= np.exp(g[t])[:, None, None]
        memory = np.einsum("hk,hkv->hv", k[t], state)  # (Hv, Dh): what the state predicts for k
        delta = (v[t] - memory) * b[t][:, None]  # (Hv, Dh)
        state += k[t][:, :, None] * delta[:, None, :]
        out[t] = np.einsum("hk,hkv->hv", q[t], state)
    return out


def chunked(q, k, v, g, b, state: np.ndarray, chunk: int) -> np.ndarray:
    """The rule in chunks of `chunk` rows (transformers' chunked form); state (Hv, Dh, Dh)
    updated in place. Returns (T, Hv, Dh)."""
    out = np.empty(v.shape, dtype=np.float32)
    for lo in range(0, len(q), chunk):
        rows = slice(lo, min(lo + chunk, len(q)))
        qc, kc, vc = (x[rows].transpose(1, 0, 2) for x in (q, k, v))  # (Hv, L, Dh)
        cum = np.cumsum(g[rows].T, axis=1)  # (Hv, L): log decay from the chunk's start
        bc = b[rows].T[:, :, None]  # (Hv, L, 1)
        n = qc.shape[1]
        lower = np.tril(np.ones((n, n), dtype=bool))
        decay = np.exp(np.where(lower, cum[:, :, None] - cum[:, None, :], -np.inf))  # (Hv, L, L)
        strict = (kc * bc) @ kc.transpose(0, 2, 1) * decay * ~np.eye(n, dtype=bool)  # (Hv, L, L)
        system = strict + np.eye(n, dtype=np.float32)  # unit lower triangular
        new_v = np.linalg.solve(system, vc * bc)  # (Hv, L, Dh)
        k_cum = np.linalg.solve(system, kc * bc * np.exp(cum)[:, :, None])  # (Hv, L, Dh)
        v_new = new_v - k_cum @ state  # (Hv, L, Dh): what the old state does not predict
        intra = (qc @ kc.transpose(0, 2, 1)) * decay  # (Hv, L, L)
        out_c = (qc * np.exp(cum)[:, :, None]) @ state + intra @ v_new  # (Hv, L, Dh)
        out[rows] = out_c.transpose(1, 0, 2)
        tail = np.exp(cum[:, -1:] - cum)[:, :, None]  # (Hv, L, 1): decay from each row to the end
        state *= np.exp(cum[:, -1])[:, None, None]
        state += (kc * tail).transpose(0, 2, 1) @ v_new
    return out


def delta_net(
    x: np.ndarray, alpha: np.ndarray, beta: np.ndarray, s: DeltaNetLayer, states: Sequence[np.ndarray]
) -> np.ndarray:
    """`Backend.delta_net` on host arrays: `states` the (Hv, Dh, Dh) state of each sequence.
    One row of a sequence steps, more go in chunks. Returns (T, Hv * Dh)."""
    q, k, v, g, b = prepare(x, alpha, beta, s)
    out = np.empty(v.shape, dtype=np.float32)  # (T, Hv, Dh)
    for rows, state in zip(row_groups(len(x), len(states)), states, strict=True):
        part = (q[rows], k[rows], v[rows], g[rows], b[rows], state)
        out[rows] = recurrent(*part) if rows.stop - rows.start == 1 else chunked(*part, s.chunk)
    return out.reshape(len(x), -1)


class HostDeltaNet:
    """`Backend.short_conv` and `Backend.delta_net` for backends whose activations are NumPy
    arrays and whose states keep each recurrent layer's arrays on the host in `arrays`
    (NumPy; the cpu backend's op-by-op passes)."""

    def short_conv(self, x: np.ndarray, weight: np.ndarray, states: Sequence[Any], layer: int) -> np.ndarray:
        """See `Backend.short_conv`."""
        out = np.empty(x.shape, dtype=np.float32)  # (T, C)
        for rows, state in zip(row_groups(len(x), len(states)), states, strict=True):
            out[rows] = short_conv(x[rows], weight, state.arrays[layer][0])
        return out

    def delta_net(
        self,
        x: np.ndarray,
        alpha: np.ndarray,
        beta: np.ndarray,
        settings: DeltaNetLayer,
        states: Sequence[Any],
        layer: int,
    ) -> np.ndarray:
        """See `Backend.delta_net`."""
        return delta_net(x, alpha, beta, settings, [state.arrays[layer][1] for state in states])
