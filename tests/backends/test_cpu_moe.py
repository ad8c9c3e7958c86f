"""The cpu backend's mixture-of-experts ops, MXFP4 blocks and attention sinks, against
independent references.

- MXFP4 blocks unpack as gguf-py dequantizes them and as the textbook value
  kvalues[code] * 2^(e - 128) (float64, rounded once), bit for bit, for every scale byte,
  every code and all-zero blocks, in every tier.
- `route` picks the experts the NumPy reference and a textbook sort by (-logit, number)
  pick, ties included, with weights within float32 rounding, in both orders.
- `experts` is a float64 textbook mixture within a bound worked out from the int16
  rounding of the activations (the gathered x, then h: per group of 32, or per 256 for the
  K-quants Q4_K-Q6_K) and float32 rounding, for T = 1, 2, 3, 7, 16, 40 tokens, 1 and 2
  threads, mixed types, with and without biases, silu and swiglu_oai; every tier gives the
  scalar tier's bits; a token's output has the same bits alone or in a batch, and for the
  types in row tiles also where its expert takes 40 tokens; an expert no token chose is never
  read (its blocks have nan scales, which any read would spread); a stack of a row-tiled type
  gets its tiles expert by expert, as the op first chooses each, and then reads only them.
- Attention with sinks equals the NumPy reference and a textbook loop, windows and rings
  included; swiglu_oai equals its float64 formula.
- A pass recorded by `RecordingRunner` (embedding, attention with sinks, router, route,
  experts) replays the op-by-op bits on two calls whose choices differ.
"""

import numpy as np
import pytest
from gguf import GGMLQuantizationType

from backends import cpu_native
from backends.base import AttentionState, ExpertWeights, LayerAttention, PassInput, Routing, Segment, WeightSpec
from backends.cpu_backend import CpuBackend, CpuMatrix, _bufs
from backends.cpu_runner import RecordingRunner
from backends.dequant import dequantize
from backends.numpy_backend import NumpyBackend
from tests.backends.test_cpu_kernels import CODES8_TYPES, INT16_DECODE_TYPES, random_matrix

T = GGMLQuantizationType
TIERS = cpu_native.runnable_tiers()
OTHER_TIERS = [t for t in TIERS if t != "scalar"] or [
    pytest.param("none", marks=pytest.mark.skip(reason="this CPU runs only the scalar tier"))
]
KVALUES = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], dtype=np.float64)
TOKEN_COUNTS = [1, 2, 3, 7, 16, 40]
# (gate, up, down) types: a dynamic quant's higher down, K-quants, gpt-oss's MXFP4, floats, a mix
TYPE_SETS = [
    (T.Q8_0, T.Q8_0, T.Q6_K),
    (T.Q4_K, T.Q4_K, T.Q4_K),
    (T.Q5_K, T.Q4_K, T.Q6_K),
    (T.MXFP4, T.MXFP4, T.MXFP4),
    (T.F32, T.F32, T.F32),
    (T.MXFP4, T.F16, T.Q8_0),
    (T.IQ2_XXS, T.Q2_K, T.IQ4_XS),  # on 8-bit activation codes (cpu_kernels/codes8_dots.c)
]
E, F, D = 8, 256, 256  # experts, expert FFN width, model width (multiples of the K-quants' 256)


# -- MXFP4 ------------------------------------------------------------------------------------


def mxfp4_textbook(blocks: np.ndarray) -> np.ndarray:
    """(n, 17) blocks -> (n, 32) float32: kvalues[code] * 2^(e - 128), low nibbles first."""
    e = blocks[:, 0].astype(np.float64)
    codes = np.concatenate([blocks[:, 1:] & 15, blocks[:, 1:] >> 4], axis=1)  # (n, 32)
    with np.errstate(over="ignore"):
        return (KVALUES[codes] * np.exp2(e - 128.0)[:, None]).astype(np.float32)


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
@pytest.mark.parametrize("tier", TIERS)
def test_mxfp4_blocks_unpack_as_gguf_py_and_the_textbook(tier):
    rng = np.random.default_rng(39)
    every_scale = np.zeros((256, 17), dtype=np.uint8)  # each e with the 16 codes in both halves
    every_scale[:, 0] = np.arange(256)
    every_scale[:, 1:] = np.arange(16, dtype=np.uint8) | (np.arange(16, dtype=np.uint8)[::-1] << 4)
    random = rng.integers(0, 256, size=(64, 17), dtype=np.uint8)
    zeros = np.zeros((8, 17), dtype=np.uint8)
    blocks = np.concatenate([every_scale, random, zeros])  # (328, 17): 41 rows of 8 blocks
    rows, cols = blocks.shape[0] // 8, 256
    raw = blocks.reshape(-1)
    backend = CpuBackend(threads=1, tier=tier)
    ours = np.array(backend.embedding(CpuMatrix("w", raw, int(T.MXFP4), rows, cols), np.arange(rows)))
    gguf_py = dequantize(raw, int(T.MXFP4), (rows, cols))
    np.testing.assert_array_equal(ours.view(np.uint32), gguf_py.view(np.uint32))
    np.testing.assert_array_equal(ours.reshape(-1, 32).view(np.uint32), mxfp4_textbook(blocks).view(np.uint32))
    assert np.all(ours[-1] == 0.0) and np.isposinf(ours).any()  # zeros, and 12 * 2^127 overflows as in gguf-py


# -- routing ----------------------------------------------------------------------------------


def textbook_route(logits: np.ndarray, routing: Routing) -> tuple[np.ndarray, np.ndarray]:
    """The chosen experts (T, k) and weights (float64) by a sort on (-logit, number)."""
    chosen, weights = [], []
    for row in logits.astype(np.float64):
        top = sorted(range(len(row)), key=lambda e: (-row[e], e))[: routing.n_used]
        if routing.order == "top_k_softmax":
            w = np.exp(row[top] - row[top[0]])
            w /= w.sum()
        else:
            p = np.exp(row - row.max())
            w = p[top] / p.sum()
            if routing.normalize:
                w /= w.sum()
        chosen.append(top)
        weights.append(w)
    return np.array(chosen), np.array(weights)


@pytest.mark.parametrize(
    "order,normalize", [("softmax_top_k", True), ("softmax_top_k", False), ("top_k_softmax", True)]
)
@pytest.mark.parametrize("n_experts,k", [(8, 2), (128, 8), (32, 4), (5, 5), (6, 1)])
def test_route_picks_the_reference_experts_ties_to_the_lower_number(order, normalize, n_experts, k):
    rng = np.random.default_rng(n_experts * 10 + k)
    routing = Routing(n_experts, k, order, normalize)
    smooth = rng.standard_normal((37, n_experts)).astype(np.float32) * 3
    ties = rng.integers(-2, 3, size=(37, n_experts)).astype(np.float32)  # many equal logits
    backend = CpuBackend(threads=2)
    for logits in (smooth, ties, np.zeros((2, n_experts), dtype=np.float32)):
        ours = np.array(backend.route(logits, routing))
        assert ours.shape == (len(logits), 2 * k) and ours.dtype == np.float32
        reference = NumpyBackend().route(logits, routing)
        chosen, weights = textbook_route(logits, routing)
        np.testing.assert_array_equal(ours[:, :k], reference[:, :k])
        np.testing.assert_array_equal(ours[:, :k], chosen)
        np.testing.assert_allclose(ours[:, k:], reference[:, k:], rtol=2e-6, atol=1e-7)
        np.testing.assert_allclose(ours[:, k:], weights, rtol=2e-6, atol=1e-7)


# -- the experts ------------------------------------------------------------------------------


def expert_stack(qtype: T, n_experts: int, rows: int, cols: int, rng: np.random.Generator, name: str) -> WeightSpec:
    raw = random_matrix(qtype, n_experts * rows, cols, rng)  # (E * rows, bytes per row)
    if qtype in (T.F32, T.F16):  # random_matrix's float rows are N(0, 1): as small as the blocks' weights
        raw = (
            (dequantize(raw.reshape(-1), int(qtype), (n_experts * rows, cols)) * 0.05)
            .astype(np.float32 if qtype == T.F32 else np.float16)
            .view(np.uint8)
        )
    return WeightSpec(name, raw.reshape(-1), int(qtype), (n_experts, rows, cols))


class Layer:
    """A random MoE layer: its GGUF tensors, their float64 values, and float32 biases."""

    def __init__(self, types: tuple[T, T, T], biases: bool, seed: int, n_experts: int = E):
        rng = np.random.default_rng(seed)
        gate_t, up_t, down_t = types
        self.specs = (
            expert_stack(gate_t, n_experts, F, D, rng, "blk.0.ffn_gate_exps.weight"),
            expert_stack(up_t, n_experts, F, D, rng, "blk.0.ffn_up_exps.weight"),
            expert_stack(down_t, n_experts, D, F, rng, "blk.0.ffn_down_exps.weight"),
        )
        self.dense = [dequantize(s.raw, s.ggml_type, s.shape).astype(np.float64) for s in self.specs]
        self.biases = (
            tuple(
                rng.standard_normal(shape).astype(np.float32)
                for shape in ((n_experts, F), (n_experts, F), (n_experts, D))
            )
            if biases
            else (None, None, None)
        )

    def weights(self, backend) -> ExpertWeights:
        return ExpertWeights(*(backend.prepare_weight(s) for s in self.specs), *self.biases)


def silu64(g):
    return g / (1.0 + np.exp(-g))


def act64(g, u, kind):
    if kind == "silu":
        return silu64(g) * u
    g = np.minimum(g, 7.0)
    return g / (1.0 + np.exp(-1.702 * g)) * (np.clip(u, -7.0, 7.0) + 1.0)


def quantization_error(x: np.ndarray, w: np.ndarray, qtype: T) -> np.ndarray:
    """The most x @ w.T can be off when each group of x (n, K) is rounded to the codes
    `qtype`'s product takes (half a step, amax / (2 * code_max), each: int16 codes per 32, or
    per 256 for Q4_K-Q6_K, or 8-bit ones per 32; w (R, K)), plus float32 sums (1e-5 relative)."""
    n, K = x.shape
    code_max = 127 if qtype in CODES8_TYPES else 32767
    span = 256 if qtype in INT16_DECODE_TYPES else 32
    step = np.abs(x).reshape(n, K // span, span).max(-1) / (2.0 * code_max)  # (n, groups)
    grouped = np.abs(w).reshape(w.shape[0], K // span, span).sum(-1)  # (R, groups)
    return step @ grouped.T * 1.001 + 1e-5 * (np.abs(x) @ np.abs(w).T)


def textbook_mixture(
    layer: Layer, x: np.ndarray, choice: np.ndarray, kind: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The float64 mixture, how far the kernels may be from it, element by element, and the
    sum of the absolute values of its terms (the scale the bound is small against).

    gate and up are off by at most quantization_error(x, ...); the activation is 1.1-Lipschitz in
    the gate (silu' <= 1.0998, and (g sigmoid(1.702 g))' is silu' at 1.702 g; the clamps are
    1-Lipschitz) and multiplies the up, so h is off by at most
        dh = 1.1 dg (|u'| + du) + (|a(g)| + 1.1 dg) du  (+ 1e-6 |h| of float32 rounding),
    u' = u, or clamp(u) + 1; h's own rounding to codes adds quantization_error(|h| + dh, ...) to
    the down product, which also carries |W_d| dh. Each token sums w_j times its experts'.
    """
    gate_w, up_w, down_w = layer.dense
    gate_t, up_t, down_t = (s.ggml_type for s in layer.specs)
    gb, ub, db = (None if b is None else b.astype(np.float64) for b in layer.biases)
    k = choice.shape[1] // 2
    out = np.zeros((len(x), D))
    bound = np.zeros((len(x), D))
    magnitude = np.zeros((len(x), D))
    x64 = x.astype(np.float64)
    for t in range(len(x)):
        for j in range(k):
            e, w = int(choice[t, j]), float(choice[t, k + j])
            xt = x64[t : t + 1]
            g, u = xt @ gate_w[e].T, xt @ up_w[e].T  # (1, F)
            dg, du = quantization_error(xt, gate_w[e], gate_t), quantization_error(xt, up_w[e], up_t)
            if gb is not None:
                g, u = g + gb[e], u + ub[e]
            h = act64(g, u, kind)
            if kind == "silu":
                gain, scale_g = np.abs(u), np.abs(silu64(g))
            else:
                gc = np.minimum(g, 7.0)
                gain, scale_g = np.abs(np.clip(u, -7.0, 7.0) + 1.0), np.abs(gc / (1.0 + np.exp(-1.702 * gc)))
            dh = 1.1 * dg * (gain + du) + (scale_g + 1.1 * dg) * du + 1e-6 * np.abs(h)
            y = h @ down_w[e].T  # (1, D)
            dy = quantization_error(np.abs(h) + dh, down_w[e], down_t) + dh @ np.abs(down_w[e]).T
            if db is not None:
                y = y + db[e]
            out[t] += w * y[0]
            bound[t] += abs(w) * dy[0] + 1e-6 * np.abs(w * y[0])
            magnitude[t] += abs(w) * (np.abs(h) @ np.abs(down_w[e]).T)[0]
    return out, bound, magnitude


def routed(x: np.ndarray, n_experts: int, k: int, seed: int, favourite: bool = False, shunned: int = 0) -> np.ndarray:
    """A choice (T, 2k) from random router logits; with `favourite`, every token takes
    expert 0 (a group of 32 or more tokens: the float product); no token takes the last
    `shunned` experts."""
    logits = np.random.default_rng(seed).standard_normal((len(x), n_experts)).astype(np.float32)
    if favourite:
        logits[:, 0] += 10.0
    if shunned:
        logits[:, n_experts - shunned :] -= 20.0
    return NumpyBackend().route(logits, Routing(n_experts, k, "softmax_top_k"))


def tokens(n: int, seed: int) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((n, D)).astype(np.float32) * 0.1
    x[0, :32] *= 30.0  # one group with a large scale
    return x


@pytest.mark.parametrize("kind", ["silu", "swiglu_oai"])
@pytest.mark.parametrize("biases", [False, True], ids=["no_bias", "bias"])
@pytest.mark.parametrize("types", TYPE_SETS, ids=lambda ts: "-".join(t.name for t in ts))
def test_experts_are_the_textbook_mixture_within_the_rounding_bound(types, biases, kind):
    layer = Layer(types, biases, seed=len(types[0].name) + 7 * biases)
    for threads in (1, 2):
        backend = CpuBackend(threads=threads)
        weights = layer.weights(backend)
        for n in TOKEN_COUNTS:
            x = tokens(n, n)
            choice = routed(x, E, 2, seed=n, favourite=n == 40)
            got = np.array(backend.experts(x, choice, weights, kind))
            exact, bound, magnitude = textbook_mixture(layer, x, choice, kind)
            assert np.all(np.isfinite(got))
            excess = np.abs(got - exact) - bound
            assert np.all(excess <= 0), f"T={n} threads={threads}: over the bound by {excess.max():.3g}"
            # a bound that says something: well below the terms' scale (measured medians 1e-3 .. 3e-2), which a
            # wrong mixture (a lost bias, another activation, a wrong weight) would miss by; the worst case of the
            # 8-bit codes (median 0.4) and of the codes per 256 (up to 0.29 beside one token's large group) is
            # looser, so for them the error itself (medians 1e-3 .. 4e-3; per 256, under 1e-4) is held to it
            loose = types[0] in CODES8_TYPES or types[0] in INT16_DECODE_TYPES
            off = np.abs(got - exact) if loose else bound
            assert np.median(off / magnitude) < 0.05


@pytest.mark.parametrize("tier", OTHER_TIERS)
@pytest.mark.parametrize("types", TYPE_SETS, ids=lambda ts: "-".join(t.name for t in ts))
def test_every_tier_gives_the_scalar_experts_bit_for_bit(tier, types):
    layer = Layer(types, biases=True, seed=3)
    scalar = CpuBackend(threads=1, tier="scalar")
    scalar_weights = layer.weights(scalar)
    for threads in (1, 2):
        other = CpuBackend(threads=threads, tier=tier)
        weights = layer.weights(other)
        for n in TOKEN_COUNTS:
            x = tokens(n, 100 + n)
            choice = routed(x, E, 2, seed=n, favourite=n == 40)
            for kind in ("silu", "swiglu_oai"):
                expected = np.array(scalar.experts(x, choice, scalar_weights, kind))
                got = np.array(other.experts(x, choice, weights, kind))
                np.testing.assert_array_equal(got.view(np.uint32), expected.view(np.uint32), err_msg=f"T={n} {kind}")


@pytest.mark.parametrize(
    "types", [TYPE_SETS[0], TYPE_SETS[2], TYPE_SETS[4]], ids=lambda ts: "-".join(t.name for t in ts)
)
def test_a_tokens_output_is_the_same_alone_or_in_a_batch(types):
    """A batched server step or a draft's verification gives each token the bits of its own
    decode step (groups under FLOAT_TOKENS = 32 tokens per expert)."""
    layer = Layer(types, biases=True, seed=11)
    backend = CpuBackend(threads=2)
    weights = layer.weights(backend)
    for n in (2, 7, 16):
        x = tokens(n, 200 + n)
        choice = routed(x, E, 4, seed=300 + n)
        batch = np.array(backend.experts(x, choice, weights, "swiglu_oai"))
        alone = np.concatenate(
            [np.array(backend.experts(x[t : t + 1], choice[t : t + 1], weights, "swiglu_oai")) for t in range(n)]
        )
        np.testing.assert_array_equal(batch.view(np.uint32), alone.view(np.uint32))


@pytest.mark.parametrize("types", [TYPE_SETS[0], TYPE_SETS[2], TYPE_SETS[3]], ids=lambda ts: "-".join(t.name for t in ts))
def test_the_types_in_row_tiles_give_a_token_the_same_bits_in_a_prefill_as_alone(types):
    """The experts of the types on int16 codes (the 32-weight ones per 32, Q4_K and Q6_K per 256)
    are multiplied from row tiles for any count of tokens, as their dense products are (Q5_K's
    rows straight from the bytes, in the same int16 codes for any count)
    (cpu_kernels/row_tiles.c): a token's output has the bits of its decode step also where its
    expert takes 40 tokens (a prefill's crowded expert, past FLOAT_TOKENS, where the rows as the
    file has them would dequantize to float)."""
    layer = Layer(types, biases=True, seed=17)
    backend = CpuBackend(threads=2)
    weights = layer.weights(backend)
    for n in (5, 40):
        x = tokens(n, 400 + n)
        choice = routed(x, E, 2, seed=500 + n, favourite=True)
        batch = np.array(backend.experts(x, choice, weights, "silu"))
        alone = np.concatenate(
            [np.array(backend.experts(x[t : t + 1], choice[t : t + 1], weights, "silu")) for t in range(n)]
        )
        np.testing.assert_array_equal(batch.view(np.uint32), alone.view(np.uint32), err_msg=f"T={n}")


@pytest.mark.parametrize("types", [(T.Q8_0, T.Q8_0, T.Q6_K), (T.Q4_K, T.Q4_K, T.Q4_K)], ids=["Q8_0-Q6_K", "Q4_K"])
@pytest.mark.parametrize("n", [1, 3, 40])
def test_an_expert_no_token_chose_is_never_read(types, n):
    """Every block of the experts no token chose gets a nan scale (fp16 0x7e00): a read of
    any of them would make some output nan (the prepared stack is a view of these bytes).
    The output has the bits of the clean layer's."""
    layer = Layer(types, biases=True, seed=5)
    x = tokens(n, 400 + n)
    choice = routed(x, E, 2, seed=500 + n, favourite=n == 40, shunned=2)
    chosen = set(choice[:, :2].astype(int).ravel().tolist())
    unchosen = sorted(set(range(E)) - chosen)
    assert unchosen, "the test needs an expert nobody chose"
    backend = CpuBackend(threads=2)
    clean = np.array(backend.experts(x, choice, layer.weights(backend), "silu"))
    poisoned = []
    for spec in layer.specs:
        blocks = spec.raw.copy().reshape(E, -1)  # (E, bytes per expert)
        qtype = T(spec.ggml_type)
        block_bytes = {T.Q8_0: 34, T.Q4_K: 144, T.Q6_K: 210}[qtype]
        scale_at = 208 if qtype == T.Q6_K else 0
        for e in unchosen:
            expert = blocks[e].reshape(-1, block_bytes)
            expert[:, scale_at : scale_at + 2] = np.array([0x00, 0x7E], dtype=np.uint8)  # fp16 nan
        poisoned.append(WeightSpec(spec.name, blocks.reshape(-1), spec.ggml_type, spec.shape))
    weights = ExpertWeights(*(backend.prepare_weight(s) for s in poisoned), *layer.biases)
    for w, spec in zip((weights.gate, weights.up, weights.down), poisoned, strict=True):
        assert np.shares_memory(w.matrix.raw, spec.raw)  # in place: the poisoned bytes are what it would read
    got = np.array(backend.experts(x, choice, weights, "silu"))
    np.testing.assert_array_equal(got.view(np.uint32), clean.view(np.uint32))
    with np.errstate(invalid="ignore"):  # and a choice of a poisoned expert does read nan
        bad = choice.copy()
        bad[:, 0] = unchosen[0]
        assert np.isnan(np.array(backend.experts(x, bad, weights, "silu"))).any()


@pytest.mark.parametrize("types", [TYPE_SETS[2], TYPE_SETS[3], TYPE_SETS[5]], ids=lambda ts: "-".join(t.name for t in ts))
def test_a_stack_in_row_tiles_gets_its_tiles_expert_by_expert_as_they_are_chosen(types):
    """A stack of a type on int16 codes keeps row tiles of its blocks' size, made for an expert
    when the op first chooses it (its flag then set) and never for the others; from then on the
    op reads the tiles alone: the chosen experts' blocks zeroed, the output keeps its bits. A
    float stack and a Q5_K one have none."""
    layer = Layer(types, biases=True, seed=23)
    backend = CpuBackend(threads=2)
    weights = layer.weights(backend)
    stacks = (weights.gate, weights.up, weights.down)
    for stack, qtype in zip(stacks, types, strict=True):
        if qtype in (T.F16, T.F32, T.Q5_K):
            assert stack.tiles is None
        else:
            assert stack.tiles.nbytes == stack.matrix.raw.nbytes and not stack.ready.any()
    x = tokens(7, 600)
    choice = routed(x, E, 2, seed=601, shunned=3)
    chosen = np.zeros(E, dtype=bool)
    chosen[choice[:, :2].astype(int).ravel()] = True
    first = np.array(backend.experts(x, choice, weights, "silu"))
    for stack in stacks:
        if stack.tiles is not None:
            np.testing.assert_array_equal(stack.ready.astype(bool), chosen)
            stack.matrix.raw.reshape(E, -1)[chosen] = 0  # what the op reads now: the tiles
    np.testing.assert_array_equal(np.array(backend.experts(x, choice, weights, "silu")), first)
    later = choice.copy()
    later[0, 0] = E - 1  # a shunned expert, chosen now: its tiles made then
    backend.experts(x[:1], later[:1], weights, "silu")
    assert all(stack.ready[E - 1] for stack in stacks if stack.tiles is not None)


def test_expert_stacks_stay_views_of_the_file_and_other_types_are_converted():
    rng = np.random.default_rng(9)
    backend = CpuBackend(threads=1)
    native = expert_stack(T.MXFP4, 4, 64, 96, rng, "blk.0.ffn_up_exps.weight")
    prepared = backend.prepare_weight(native)
    assert prepared.matrix.ggml_type == T.MXFP4 and np.shares_memory(prepared.matrix.raw, native.raw)
    assert (prepared.n_experts, prepared.rows_per_expert, prepared.matrix.rows) == (4, 64, 256)
    assert backend.load_notes == []
    dense = rng.standard_normal((4, 64, 256)).astype(np.float32)
    bias = backend.prepare_weight(
        WeightSpec("blk.0.ffn_up_exps.bias", dense[:, 0].view(np.uint8).reshape(-1), 0, (4, 256))
    )
    assert bias.dtype == np.float32 and bias.shape == (4, 256)
    # Q1_0 (128 weights: an fp16 scale, then a sign bit each, LSB first) has no kernel for expert stacks
    groups = dense.reshape(-1, 128)  # (blocks, 128)
    scales = np.abs(groups).mean(axis=1).astype(np.float16).view(np.uint8).reshape(-1, 2)
    bits = np.packbits(groups > 0, axis=1, bitorder="little")  # (blocks, 16)
    raw = np.concatenate([scales, bits], axis=1).reshape(-1)
    one_bit = WeightSpec("blk.0.ffn_gate_exps.weight", raw, int(T.Q1_0), (4, 64, 256))
    converted = backend.prepare_weight(one_bit)
    assert converted.matrix.ggml_type == T.Q8_0 and converted.matrix.rows == 256
    assert backend.load_notes == [
        "blk.0.ffn_gate_exps.weight is Q1_0, which the cpu backend has no kernel for: converted to Q8_0 at load"
    ]
    values = dequantize(raw, int(T.Q1_0), (256, 256))
    # Q8_0 of the same values: within half a code (amax / 254) and the fp16 scale's rounding
    np.testing.assert_allclose(
        dequantize(converted.matrix.raw, int(T.Q8_0), (256, 256)), values, atol=np.abs(values).max() / 120
    )


def test_a_choice_outside_the_layers_experts_is_refused():
    layer = Layer(TYPE_SETS[0], biases=False, seed=1)
    backend = CpuBackend(threads=1)
    x = tokens(2, 1)
    choice = routed(x, E, 2, seed=1)
    for bad in (float(E), -1.0, 1.5, np.nan):
        wrong = choice.copy()
        wrong[1, 1] = bad
        with pytest.raises(RuntimeError, match="not one of the layer's experts"):
            backend.experts(x, wrong, layer.weights(backend), "silu")


def test_tiles_made_expert_by_expert_need_a_flag_per_expert_and_serve_only_the_experts_op():
    """The kernels refuse a stack to tile expert by expert whose flags are fewer than its experts
    (they would write past them), and a matrix product given such a stack (its tiles are made
    only as the experts op chooses experts): a clear error, nothing run."""
    layer = Layer((T.Q4_K, T.Q4_K, T.Q6_K), biases=False, seed=2)
    backend = CpuBackend(threads=1)
    weights = layer.weights(backend)
    x = tokens(2, 2)
    choice = routed(x, E, 2, seed=2)
    tiles = backend.native.ROW_TILES
    mats = [stack.entry(None, tiles) for stack in (weights.gate, weights.up, weights.down)]
    out = np.empty((2, D), dtype=np.float32)
    bufs = _bufs(a=x, b=choice, out=out)
    slots = dict(tokens=2, experts=E, used=2, ffn=F, activation=0)
    short = mats[0][:7] + (weights.gate.ready[: E - 1],) + mats[0][8:]
    with pytest.raises(ValueError, match="inconsistent arguments"):
        backend._emit("experts", bufs, (short, mats[1], mats[2]), **slots)
    backend._emit("experts", bufs, tuple(mats), **slots)  # the same op, whole: runs
    stack = mats[0][:4] + (np.empty((2, F), dtype=np.float32), None) + mats[0][6:]
    with pytest.raises(ValueError, match="inconsistent arguments"):
        backend._emit("linear", _bufs(a=x), (stack,), tokens=2)


# -- swiglu_oai and attention sinks -----------------------------------------------------------


def test_swiglu_oai_matches_its_float64_formula_and_the_reference():
    rng = np.random.default_rng(7)
    special = [0.0, 6.9, 7.0, 7.1, -7.1, 30.0, -30.0, 100.0, -100.0]
    gate = np.concatenate([rng.standard_normal(1001) * 6, special]).astype(np.float32)
    up = np.concatenate([rng.standard_normal(1001) * 6, special[::-1]]).astype(np.float32)
    g, u = np.minimum(gate.astype(np.float64), 7.0), np.clip(up.astype(np.float64), -7.0, 7.0)
    expected = g / (1.0 + np.exp(-1.702 * g)) * (u + 1.0)
    ours = np.array(CpuBackend(threads=2).gated_activation(gate, up, "swiglu_oai"))
    np.testing.assert_allclose(ours, expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(ours, NumpyBackend().gated_activation(gate, up, "swiglu_oai"), rtol=1e-6, atol=1e-6)


def textbook_sink_attention(q, keys, values, positions, scale, sinks, window=None):
    """Per query and head: softmax over the visible scores and the head's sink, float64."""
    n_new, n_heads, _ = q.shape
    group = n_heads // keys.shape[1]
    out = np.zeros((n_new, n_heads, values.shape[2]))
    for t, pos in enumerate(positions):
        visible = [j for j in range(pos + 1) if window is None or j > pos - window]
        for h in range(n_heads):
            s = np.array([float(q[t, h].astype(np.float64) @ keys[j, h // group]) * scale for j in visible])
            top = max(s.max(), float(sinks[h]))
            p = np.exp(s - top)
            p /= p.sum() + np.exp(float(sinks[h]) - top)
            out[t, h] = sum(pj * values[j, h // group].astype(np.float64) for pj, j in zip(p, visible, strict=True))
    return out.reshape(n_new, -1)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("window,ring", [(None, False), (5, False), (5, True)], ids=["full", "window", "ring"])
def test_attention_with_sinks_matches_the_reference_and_the_textbook(window, ring, threads):
    rng = np.random.default_rng(17 + threads)
    heads, kv_heads, dh, dv, total = 8, 2, 64, 32, 30
    q = rng.standard_normal((total, heads, dh)).astype(np.float32)
    k = rng.standard_normal((total, kv_heads, dh)).astype(np.float32)
    v = rng.standard_normal((total, kv_heads, dv)).astype(np.float32)
    sinks = (rng.standard_normal(heads) * 3).astype(np.float32)
    sinks[0] = 40.0  # a sink that takes nearly all the weight: the maximum is the sink's
    settings = LayerAttention(scale=0.125, window=window, sinks=sinks)
    slots = 8 if ring else total
    layer = AttentionState(kv_heads, dh, dv, slots=slots, window=window if ring else None)
    step = layer.pass_tokens or 16  # a ring's longest pass
    cpu, ref = CpuBackend(threads=threads), NumpyBackend()
    cpu_state, ref_state = cpu.allocate_state([layer]), ref.allocate_state([layer])
    ours, reference = [], []
    for start in list(range(0, 12, step)) + list(range(12, total)):  # prefill chunks, then one token at a time
        end = min(start + step, 12) if start < 12 else start + 1
        part = (q[start:end], k[start:end], v[start:end])
        ours.append(np.array(cpu.attention(*part, cpu_state, 0, start, settings)))
        reference.append(ref.attention(*part, ref_state, 0, start, settings))
    ours_all = np.concatenate(ours)
    np.testing.assert_allclose(ours_all, np.concatenate(reference), rtol=1e-5, atol=1e-6)
    expected = textbook_sink_attention(q, k, v, range(total), 0.125, sinks, window)
    np.testing.assert_allclose(ours_all, expected, rtol=1e-5, atol=1e-6)
    without = textbook_sink_attention(q, k, v, range(total), 0.125, np.full(heads, -np.inf), window)
    assert not np.allclose(ours_all, without)  # the sinks do change the answer


# -- a recorded pass ----------------------------------------------------------------------------


def test_a_recorded_pass_replays_the_op_by_op_bits_with_the_choice_made_per_call():
    """embedding -> attention with sinks -> router -> route -> experts, recorded once by the
    cpu runner and replayed: each call's choice is computed in C, so two calls whose tokens
    choose different experts give the op-by-op run's bits."""
    rng = np.random.default_rng(23)
    vocab, heads, dh = 50, 4, 64
    layer = Layer((T.Q8_0, T.MXFP4, T.Q6_K), biases=True, seed=29)
    backend = CpuBackend(threads=2)
    weights = layer.weights(backend)

    def matrix(name, rows, cols):
        raw = random_matrix(T.Q8_0, rows, cols, rng).reshape(-1)
        return backend.prepare_weight(WeightSpec(name, raw, int(T.Q8_0), (rows, cols)))

    embedding, router = matrix("token_embd.weight", vocab, D), matrix("blk.0.ffn_gate_inp.weight", E, D)
    wq, wk, wv = (matrix(f"blk.0.attn_{n}.weight", heads * dh if n == "q" else dh, D) for n in "qkv")
    settings = LayerAttention(scale=0.125, sinks=rng.standard_normal(heads).astype(np.float32))
    routing = Routing(E, 2, "top_k_softmax")
    choices = []

    def forward(p: PassInput):
        h = backend.embedding(embedding, p.tokens)  # (T, D)
        n = len(h)
        q = backend.linear(h, wq).reshape(n, heads, dh)
        k = backend.linear(h, wk).reshape(n, 1, dh)
        v = backend.linear(h, wv).reshape(n, 1, dh)
        seg = p.segments[0]
        a = backend.attention(q, k, v, seg.state, 0, seg.start, settings)  # (T, H * dh)
        h2 = backend.add(h, backend.linear(a, matrix_o))
        choice = backend.route(backend.linear(h2, router), routing)  # (T, 4)
        choices.append(choice)
        return backend.experts(h2, choice, weights, "swiglu_oai")

    matrix_o = matrix("blk.0.attn_output.weight", D, heads * dh)
    state_of = AttentionState(1, dh, dh, slots=32)
    recorded_state, eager_state = backend.allocate_state([state_of]), backend.allocate_state([state_of])
    runner = RecordingRunner(backend, forward)
    picked = []
    start = 0
    for step_tokens in ([3, 17, 41], [8, 9, 44]):  # the same pass shape twice
        ids = np.array(step_tokens)
        replayed = runner(ids, [Segment(recorded_state, start, len(ids))], all_logits=True)
        eager = forward(
            PassInput(ids, np.arange(start, start + len(ids)), (Segment(eager_state, start, len(ids)),), True)
        )
        np.testing.assert_array_equal(np.asarray(replayed).view(np.uint32), np.asarray(eager).view(np.uint32))
        picked.append(np.array(choices[-1])[:, :2])
        start += len(ids)
    assert runner.recordings == 1 and runner.passes[("tokens", 3, recorded_state.shape)].runs == 2
    assert not np.array_equal(picked[0], picked[1]), "the two calls should choose different experts"


@pytest.mark.parametrize("tier", OTHER_TIERS)
def test_route_swiglu_and_sinks_are_the_same_bits_in_every_tier(tier):
    rng = np.random.default_rng(31)
    logits = (rng.standard_normal((40, 128)) * 4).astype(np.float32)
    gate, up = (rng.standard_normal((2, 4099)) * 8).astype(np.float32)
    q = rng.standard_normal((9, 4, 64)).astype(np.float32)
    k, v = rng.standard_normal((2, 9, 2, 64)).astype(np.float32)
    settings = LayerAttention(scale=0.125, window=4, sinks=rng.standard_normal(4).astype(np.float32))
    results = []
    for name in ("scalar", tier):
        be = CpuBackend(threads=2, tier=name)
        state = be.allocate_state([AttentionState(2, 64, 64, slots=9)])
        results.append(
            [
                np.array(be.route(logits, Routing(128, 8, "softmax_top_k"))),
                np.array(be.route(logits, Routing(128, 4, "top_k_softmax"))),
                np.array(be.gated_activation(gate, up, "swiglu_oai")),
                np.array(be.attention(q, k, v, state, 0, 0, settings)),
            ]
        )
    for ours, scalar in zip(results[1], results[0], strict=True):
        np.testing.assert_array_equal(ours.view(np.uint32), scalar.view(np.uint32))
