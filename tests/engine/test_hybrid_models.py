"""Qwen3.5 and Qwen3.5-MoE (hybrid Gated DeltaNet / gated attention) against transformers in
float32, and their recurrent state through prefill, decoding, rollback and reuse (fixtures from
tools/fixtures/make_hybrid_fixtures.py: tiny random models converted by llama.cpp).

The long prompts (200 and 260 tokens) span more than three chunks of the recurrent scan (64).
NumPy is the reference: its logits within 1e-3 of the range of transformers' (F32, and each
quantized file against transformers on its dequantized weights), its greedy continuations equal,
its state after a chunked prefill equal to transformers' state and to the state after the
same tokens one by one. Faster backends: within 5e-2 with the same top token."""

import importlib.util
import json

import numpy as np
import pytest
from gguf import GGUFReader

from backends.base import Segment
from engine.decoding import Draft, DraftStats, speculative_tokens
from engine.generation import generate
from engine.kv_cache import KVCache
from engine.loader import load_model
from engine.sampling import Sampler, SamplingParams
from engine.saved_state import SavedStates, identity_of
from engine.speculation import FixedLength
from tests.engine.parity_models import op_by_op
from tests.engine.test_moe_against_transformers import FIXTURES, assert_last_logits_agree, expected, load, reference
from tests.gguf_factory import copy_gguf

NAMES = ("tiny-qwen35", "tiny-qwen35moe")
N_PROMPTS = 4
NEAR_TIE = 2e-3  # logits: where a greedy run may part from transformers' by rounding alone


def quants(name: str) -> tuple[str, ...]:
    """The files the fixture script wrote for `name` (F32, and the quantized ones where it ran llama.cpp)."""
    info = json.loads((FIXTURES / "reference" / f"{name}.json").read_text(encoding="utf-8"))
    return tuple(info["files"])


CASES = [(name, quant) for name in NAMES for quant in quants(name)]


def recurrent_arrays(cache: KVCache) -> list[tuple[np.ndarray, ...]]:
    """Copies of every recurrent layer's arrays of a cache: (conv window, state matrices)."""
    return [tuple(np.array(a) for a in arrays) for arrays in cache.storage.arrays if arrays]


def greedy(loaded, prompt: list[int], n: int) -> list[int]:
    """Prefill, then `n` argmax tokens through one-token passes."""
    cache = loaded.new_cache(len(prompt) + n + 1)
    logits, tokens = cache.feed(loaded.model, prompt)[-1], []
    for _ in range(n):
        tokens.append(int(np.argmax(logits)))
        logits = cache.feed(loaded.model, tokens[-1:])[-1]
    return tokens


def assert_greedy_matches(tokens: list[int], ref: dict, k: int) -> None:
    """Equal to transformers' greedy run, or parted only at a step where its top two logits tie."""
    want = list(ref["greedy"][k])
    if tokens != want:
        first = next(i for i, (a, b) in enumerate(zip(tokens, want, strict=True)) if a != b)
        assert ref["greedy_margin"][k][first] < NEAR_TIE, (k, first, tokens, want)


@pytest.mark.parametrize(("name", "quant"), CASES)
def test_numpy_logits_equal_transformers(name, quant):
    ref, loaded = reference(name), load(name, quant, "numpy")
    try:
        for k in range(N_PROMPTS):
            prompt = ref[f"prompt_{k}"]
            logits = loaded.model.forward(prompt, 0, loaded.new_cache(len(prompt)).storage)[-1]  # (vocab,)
            want = expected(ref, quant, "logits")[k]
            np.testing.assert_allclose(logits, want, rtol=0, atol=1e-3 * np.ptp(want), err_msg=f"prompt {k}")
    finally:
        loaded.close()


@pytest.mark.parametrize("name", NAMES)
def test_numpy_every_position_state_and_greedy_equal_transformers(name):
    ref, loaded = reference(name), load(name, "f32", "numpy")
    try:
        prompt = ref["prompt_3"]  # 260 tokens: four chunks and a part
        all_logits = loaded.model.forward(prompt, 0, loaded.new_cache(len(prompt)).storage, all_logits=True)
        np.testing.assert_allclose(all_logits, ref["logits_all_3"], rtol=0, atol=1e-3 * np.ptp(ref["logits_all_3"]))
        cache = loaded.new_cache(256)
        cache.feed(loaded.model, list(ref["prompt_2"]))
        layers = [i for i, layer in enumerate(loaded.model.layers) if f"ssm_{i}_prompt_2" in ref]
        assert layers == [0, 1, 2]  # three Gated DeltaNet layers, then the attention layer
        for i, (window, state) in zip(layers, recurrent_arrays(cache), strict=True):
            want_window, want_state = ref[f"conv_{i}_prompt_2"], ref[f"ssm_{i}_prompt_2"]
            np.testing.assert_allclose(window, want_window, rtol=0, atol=1e-4 * np.abs(want_window).max())
            np.testing.assert_allclose(state, want_state, rtol=0, atol=1e-4 * np.abs(want_state).max())
        for k in range(N_PROMPTS):
            assert_greedy_matches(greedy(loaded, list(ref[f"prompt_{k}"]), 16), ref, k)
    finally:
        loaded.close()


@pytest.mark.parametrize("backend", ["numpy", "cpu", "mlx"])
def test_state_after_a_chunked_prefill_equals_the_state_token_by_token(backend):
    if backend == "mlx" and importlib.util.find_spec("mlx") is None:
        pytest.skip("mlx is not installed")
    ref, loaded = reference("tiny-qwen35"), load("tiny-qwen35", "f32", backend)
    try:
        prompt = list(ref["prompt_2"])  # 200 tokens: chunks of 64, 64, 64 and 8
        chunked, stepped = loaded.new_cache(256), loaded.new_cache(256)
        chunked.feed(loaded.model, prompt)
        for token in prompt:
            stepped.feed(loaded.model, [token])
        for got, want in zip(recurrent_arrays(chunked), recurrent_arrays(stepped), strict=True):
            for array, expected_array in zip(got, want, strict=True):  # the convolution's last inputs, the state
                np.testing.assert_allclose(array, expected_array, rtol=0, atol=1e-4 * np.abs(expected_array).max())
    finally:
        loaded.close()


@pytest.mark.parametrize("backend", ["numpy", "cpu"])
def test_a_rejected_draft_is_undone_from_a_snapshot(backend):
    ref, loaded = reference("tiny-qwen35moe"), load("tiny-qwen35moe", "f32", backend)
    try:
        prompt, draft = list(ref["prompt_0"]), [11, 22, 33, 44, 55]
        plain, drafted = loaded.new_cache(64), loaded.new_cache(64)
        for cache in (plain, drafted):
            cache.feed(loaded.model, prompt)
        drafted.feed(loaded.model, draft)  # a verification pass of five tokens
        drafted.trim(3)  # two accepted
        assert (drafted.restores, drafted.rereads) == (1, 0)  # restored, not read again
        plain.feed(loaded.model, draft[:2])  # the same pass the restore fed again
        assert drafted.tokens == plain.tokens
        for got, want in zip(recurrent_arrays(drafted), recurrent_arrays(plain), strict=True):
            np.testing.assert_array_equal(got[0], want[0])
            np.testing.assert_array_equal(got[1], want[1])
        nxt = [66]
        np.testing.assert_array_equal(drafted.feed(loaded.model, nxt), plain.feed(loaded.model, nxt))
    finally:
        loaded.close()


class WrongThirdDrafter:
    """Drafts the plain run's next tokens, the third of each draft changed: two accepted, the rest rejected."""

    def __init__(self, prompt: list[int], plain: list[int]):
        self.prompt, self.plain = prompt, plain

    def propose(self, history, k):
        done = len(history) - len(self.prompt)
        tokens = list(self.plain[done : done + k])
        if len(tokens) >= 3:
            tokens[2] = (tokens[2] + 1) % 384
        return Draft(tokens)


@pytest.mark.parametrize("backend", ["numpy", "cpu"])
def test_speculative_decoding_equals_plain_greedy(backend):
    ref, loaded = reference("tiny-qwen35moe"), load("tiny-qwen35moe", "f32", backend)
    try:
        prompt = list(ref["prompt_2"][:80])
        plain = greedy(loaded, prompt, 20)
        cache, stats = loaded.new_cache(128), DraftStats()
        logits = cache.feed(loaded.model, prompt)[-1]
        sampler = Sampler(SamplingParams.greedy())
        drafter = WrongThirdDrafter(prompt, plain)
        tokens = list(
            speculative_tokens(loaded.model, cache, logits, sampler, prompt, 20, drafter, FixedLength(4), stats)
        )
        assert tokens == plain
        assert stats.rounds > 0 and stats.accepted < stats.drafted  # drafts were checked, and some rejected
        assert cache.restores == stats.rounds - (stats.drafted == stats.accepted) and cache.rereads == 0
    finally:
        loaded.close()


def answer(loaded, cache: KVCache, prompt: list[int]) -> list[int]:
    """Four greedy tokens after `prompt`, reusing what `cache` holds of it."""
    params = SamplingParams.greedy()
    events = generate(loaded.model, loaded.tokenizer, cache, prompt, params, max_tokens=4, ignore_stop_tokens=True)
    return [e.token for e in events]


def test_a_reused_prefix_keeps_the_state(monkeypatch):
    ref, loaded = reference("tiny-qwen35"), load("tiny-qwen35", "f32", "numpy")
    fed: list[int] = []
    forward = loaded.model.forward
    monkeypatch.setattr(
        loaded.model, "forward", lambda tokens, *rest: fed.append(len(tokens)) or forward(tokens, *rest)
    )
    try:
        first = list(ref["prompt_2"][:120])
        longer = [*first, *ref["prompt_0"]]  # the next turn: the conversation so far, then more
        cache = loaded.new_cache(256)
        answer(loaded, cache, first)
        held = list(cache.tokens)
        fed.clear()  # prefill passes from here on (decode steps take the runner directly)
        answer(loaded, cache, [*held, *longer[120:]])
        assert cache.rereads == 0 and sum(fed) == len(longer) - 120  # only the new part of the prompt
        fed.clear()
        again = answer(loaded, cache, first)  # back to the first prompt: an earlier prefix
        assert fed == [1]  # the prompt's last token, from the snapshot before it: nothing read again
        assert again == answer(loaded, loaded.new_cache(256), first)
        assert cache.rereads == 0 and cache.restores == 1
    finally:
        loaded.close()


def test_a_restored_saved_state_never_rolls_back_to_the_snapshots_it_replaced(tmp_path):
    """Snapshots taken before a saved state was restored into the cache are of another text:
    a rollback into the restored text must read it again, never restore one of them."""
    ref, loaded = reference("tiny-qwen35"), load("tiny-qwen35", "f32", "numpy")
    try:
        text = [int(t) for t in ref["prompt_3"]]
        other, saved, more = text[:20], text[100:120], text[120:125]
        states, identity = SavedStates(tmp_path / "states"), identity_of(loaded.path, loaded.model)
        writer = loaded.new_cache(64)
        writer.feed(loaded.model, saved)
        assert states.save("c", writer, identity)
        cache = loaded.new_cache(64)
        cache.feed(loaded.model, other)  # snapshots of another text's state, at positions 0 and 19
        assert states.restore("c", cache, [*saved, *more], identity).tokens == 20
        cache.feed(loaded.model, more)
        cache.truncate(19)  # back into the restored text, where the old snapshots' positions lie
        got = cache.feed(loaded.model, saved[19:20])[-1]
        want = loaded.new_cache(64).feed(loaded.model, saved)[-1]
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-4 * float(np.ptp(want)))
    finally:
        loaded.close()


@pytest.mark.parametrize("backend", ["cpu", "mlx"])
@pytest.mark.parametrize(("name", "quant"), CASES)
def test_faster_backends_agree_with_transformers(name, quant, backend):
    if backend == "mlx" and importlib.util.find_spec("mlx") is None:
        pytest.skip("mlx is not installed")
    ref, loaded = reference(name), load(name, quant, backend)
    try:
        assert_last_logits_agree(loaded, ref, quant, N_PROMPTS)
    finally:
        loaded.close()


@pytest.mark.parametrize("name", NAMES)
def test_cpu_greedy_equals_numpy_and_its_recorded_passes_the_op_by_op_ones(name):
    ref = reference(name)
    prompts = [list(ref[f"prompt_{k}"]) for k in range(N_PROMPTS)]
    runs = {}
    for backend in ("numpy", "cpu"):
        loaded = load(name, "f32", backend)
        try:
            runs[backend] = [greedy(loaded, prompt, 16) for prompt in prompts]
            if backend == "cpu":  # a draft's check, and a batch of two sequences, against the ops one by one
                recorded, eager, apart = caches = [loaded.new_cache(64) for _ in range(3)]
                for cache in caches:
                    cache.feed(loaded.model, prompts[2][:30])
                checked = loaded.model.forward(np.asarray(prompts[2][30:34]), 30, recorded.storage, all_logits=True)
                for cache in (eager, apart):
                    eager_check = op_by_op(loaded.model, prompts[2][30:34], [Segment(cache.storage, 30, 4)])
                np.testing.assert_array_equal(checked, eager_check)
                alone = op_by_op(loaded.model, [5], [Segment(apart.storage, 34, 1)])
                batch = loaded.model.decode_batch(
                    np.array([5, 9]), np.array([34, 34]), [recorded.storage, eager.storage]
                )
                np.testing.assert_array_equal(batch[:1], alone)
                assert loaded.model.runner.recordings >= 3
        finally:
            loaded.close()
    assert runs["cpu"] == runs["numpy"]


def write_with_mtp_layer(source, target) -> None:
    """`source` as llama.cpp writes a file with a multi-token-prediction layer: one more block
    (`block_count`, `nextn_predict_layers`, a non-recurrent entry) with a tensor of its own."""
    arch = GGUFReader(source).fields["general.architecture"].contents()

    def fields(name: str, value):
        if name == f"{arch}.block_count":
            return value + 1
        return [*value, False] if name == f"{arch}.attention.recurrent_layers" else value

    extra_tensors = {"blk.4.nextn.eh_proj.weight": np.ones((256, 512), dtype=np.float32)}
    copy_gguf(source, target, fields, {f"{arch}.nextn_predict_layers": 1}, extra_tensors)


def test_a_multi_token_prediction_layer_is_left_out_with_a_note(tmp_path):
    ref = reference("tiny-qwen35")
    write_with_mtp_layer(FIXTURES / "models" / "tiny-qwen35-f32.gguf", tmp_path / "mtp.gguf")
    loaded = load_model(tmp_path / "mtp.gguf", backend="numpy")
    try:
        assert loaded.config.n_layers == 4 and len(loaded.model.layers) == 4
        assert any("multi-token-prediction" in note for note in loaded.load_notes)
        prompt = ref["prompt_0"]
        logits = loaded.model.forward(prompt, 0, loaded.new_cache(len(prompt)).storage)[-1]
        np.testing.assert_allclose(logits, ref["logits"][0], rtol=0, atol=1e-3 * np.ptp(ref["logits"][0]))
    finally:
        loaded.close()


def test_qwen35_word_splitting_is_known(tmp_path):
    # Qwen3.5's files name their pre-tokenizer "qwen35" (Qwen2's regex, letters with their marks).
    source = FIXTURES / "models" / "tiny-qwen35-f32.gguf"
    copy_gguf(source, tmp_path / "pre.gguf", lambda name, value: "qwen35" if name == "tokenizer.ggml.pre" else value)
    text = "Its rivers met, and the café's mill turned 12 times a day.\n"
    ids = {}
    for path in (source, tmp_path / "pre.gguf"):
        loaded = load_model(path, backend="numpy")
        try:
            ids[path] = loaded.tokenizer.encode(text)
        finally:
            loaded.close()
    assert ids[source] == ids[tmp_path / "pre.gguf"]  # the same pieces wherever no mark follows a letter
