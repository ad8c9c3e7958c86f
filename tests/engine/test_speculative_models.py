"""Speculative decoding on the bundled models, greedy: the same tokens as plain decoding.

Each drafter runs on SmolLM2 and Gemma-3-270M, on the native CPU backend and on NumPy, and
on the tiny Qwen3-MoE and gpt-oss fixtures on the cpu backend:
prompt lookup with a fixed draft length, the model drafting for itself (a draft model that
always shares the vocabulary), and `auto`. On the cpu backend a batch of positions gives
bit for bit the logits of feeding them one by one, so the answers must be identical. On
NumPy a batched matrix product may round differently from a one-row product; where an
answer differs, the first differing token must sit at a near-tie of the plain run's two top
logits (within NEAR_TIE). Measured: no divergence in these runs (0 of 12 answers).
"""

import threading
from pathlib import Path

import numpy as np
import pytest

from engine.bundled import bundled_model
from engine.generation import generate
from engine.loader import load_model
from engine.sampling import SamplingParams
from engine.speculation import Speculation

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "models"
MOE_FIXTURES = ("tiny-qwen3moe-q4_k_m", "tiny-gpt-oss-mxfp4")  # mixtures of experts: the choice inside each pass
N_TOKENS = 32
NEAR_TIE = 2e-3  # logits: far above float32 rounding of a product, far below a real preference
PROMPTS = [
    "Copy this line exactly, twice:\nThe quick brown fox jumps over the lazy dog near the old river bank.\n",
    "def area(width, height):\n    return width * height\n\n# The same function, renamed to rectangle_area:\n",
]


@pytest.fixture(
    scope="module",
    params=[
        *(
            pytest.param((key, backend), marks=pytest.mark.slow)
            for backend in ("cpu", "numpy")
            for key in ("smollm2", "gemma3")
        ),
        *((key, "cpu") for key in MOE_FIXTURES),
    ],
    ids=lambda p: "-".join(p),
)
def loaded(request):
    """The model, with its plain greedy answer to each prompt (computed once per module)."""
    key, backend = request.param
    model = load_model(FIXTURES / f"{key}.gguf" if key in MOE_FIXTURES else bundled_model(key).path, backend)
    prompts = [model.tokenizer.encode(text, add_bos=model.tokenizer.add_bos) for text in PROMPTS]
    yield model, [(prompt, answer(model, prompt)[0]) for prompt in prompts]
    model.close()


def answer(model, prompt, speculation=None):
    cache = model.new_cache(256)
    events = list(
        generate(
            model.model,
            model.tokenizer,
            cache,
            prompt,
            SamplingParams.greedy(),
            max_tokens=N_TOKENS,
            ignore_stop_tokens=True,
            speculation=speculation,
        )
    )
    return [e.token for e in events], events[-1].metrics


def top_two_gap(model, tokens):
    """Top logit minus the runner-up after `tokens`, from one plain pass."""
    logits = model.model.forward(np.asarray(tokens), 0, model.new_cache(len(tokens)).storage)[-1]
    top = np.sort(logits)[-2:]
    return float(top[1] - top[0])


@pytest.mark.parametrize("drafter", ["ngram", "self-draft", "auto"])
def test_greedy_speculative_answer_equals_plain(loaded, drafter):
    loaded, plain_answers = loaded
    speculation = {
        "ngram": lambda: Speculation("ngram", 4),
        "self-draft": lambda: Speculation("draft", 3, draft=loaded),
        "auto": lambda: Speculation("auto"),
    }[drafter]
    drafted = 0
    for prompt, plain in plain_answers:
        spec, metrics = answer(loaded, prompt, speculation())
        drafted += metrics.drafted_tokens
        if spec != plain:
            assert loaded.backend.name == "numpy", "the cpu backend's batches must match its single steps exactly"
            first = next(i for i, (a, b) in enumerate(zip(plain, spec, strict=True)) if a != b)
            gap = top_two_gap(loaded, prompt + plain[:first])
            assert gap < NEAR_TIE, f"token {first} differs without a near-tie (top-two gap {gap:.2e})"
            print(f"divergence at token {first}, top-two gap {gap:.2e}")
    if drafter != "auto":  # auto may decide that drafting does not pay on this machine
        assert drafted > 0, "the drafter never proposed anything: the test would check plain decoding only"


@pytest.mark.parametrize("backend", ["cpu", "numpy"])
def test_a_cache_that_rolled_back_drafts_holds_what_plain_decoding_wrote(tmp_path, backend):
    """Drafts that are always wrong: every round writes keys and values for positions it then
    forgets. When the answer is stopped after a few tokens, the storage equals a plain run's,
    position by position, the forgotten positions past the end too."""
    from engine.decoding import Draft
    from tests.gguf_factory import write_tiny_model

    model = load_model(write_tiny_model(tmp_path / "tiny.gguf"), backend)

    class Wrong:
        def propose(self, history, k):
            return Draft([(history[-1] + 1 + i) % model.config.vocab_size for i in range(k)])

    def stopped_answer(speculation=None):
        cache, cancel = model.new_cache(64), threading.Event()
        events = []
        for event in generate(model.model, model.tokenizer, cache, [5, 6, 7, 8, 9], SamplingParams.greedy(),
                              max_tokens=20, ignore_stop_tokens=True, speculation=speculation, cancel=cancel):
            events.append(event)
            if len(events) == 6:
                cancel.set()  # the last round's 4 drafts were verified and rolled back
        return events, cache

    plain, plain_cache = stopped_answer()
    speculation = Speculation("ngram", 4)
    speculation.new_drafter = lambda *args: Wrong()
    spec, spec_cache = stopped_answer(speculation)
    assert [e.token for e in spec] == [e.token for e in plain] and spec[-1].finish_reason == "cancelled"
    # the first token comes from the prompt's logits; each of the next five checked 4 drafts
    assert spec[-1].metrics.drafted_tokens == 4 * 5 and spec[-1].metrics.accepted_tokens == 0
    assert plain_cache.tokens == spec_cache.tokens
    plain_kv, spec_kv = plain_cache.storage, spec_cache.storage
    plain_arrays, spec_arrays = plain_kv.keys + plain_kv.values, spec_kv.keys + spec_kv.values  # per layer (Hkv, N, D)
    for plain_array, spec_array in zip(plain_arrays, spec_arrays, strict=True):
        if backend == "cpu":  # a batch of positions equals feeding them one by one, bit for bit
            np.testing.assert_array_equal(plain_array, spec_array)
        else:  # a batched float32 product may round differently from a one-row one, and then
            # the float16 cache may keep the float16 value one step (2^-10) to either side
            np.testing.assert_allclose(plain_array, spec_array, rtol=2.0**-10, atol=1e-6)
    used = spec_cache.n_used
    assert not any(array[:, used:].any() for array in spec_arrays)
    model.close()
