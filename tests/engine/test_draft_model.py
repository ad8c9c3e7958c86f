"""Draft models: llama.cpp's compatibility checks, with the reason for each refusal, and
speculative decoding with a draft model on synthetic pairs (tests/gguf_factory.py).

The bundled SmolLM2 and Gemma-3-270M do not share a vocabulary, so the pairs that can
draft are written here: models of other shapes and weights over the same tiny vocabulary.
"""

import pytest

from engine.bundled import bundled_model
from engine.cli import main
from engine.draft_model import draft_refusals
from engine.errors import DraftModelError
from engine.generation import generate
from engine.gguf_file import open_gguf
from engine.loader import load_model
from engine.sampling import SamplingParams
from engine.speculation import Speculation, check_draft
from tests.gguf_factory import tiny_vocab, write_tiny_model

VOCAB = 288


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A target and drafts that differ from it in one way each."""
    folder = tmp_path_factory.mktemp("drafts")
    tokens, _ = tiny_vocab(VOCAB)
    renamed = list(tokens)
    renamed[270] = "renamed"

    def write(name, **kwargs):
        return write_tiny_model(folder / f"{name}.gguf", **kwargs)

    return {
        "target": write("target", seed=0),
        "smaller": write("smaller", n_layers=1, d_model=32, n_heads=2, n_kv_heads=1, d_ff=64, seed=1),
        "other-arch": write("other-arch", arch="llama", seed=2),
        "larger-vocab": write("larger-vocab", vocab=VOCAB + 100, seed=3),
        "much-larger-vocab": write("much-larger-vocab", vocab=VOCAB + 200, seed=4),
        "renamed-token": write("renamed-token", seed=5, **{"tokenizer.ggml.tokens": renamed}),
        "adds-bos": write("adds-bos", seed=6, **{"tokenizer.ggml.add_bos_token": True}),
        "other-eos": write("other-eos", seed=7, **{"tokenizer.ggml.eos_token_id": 280}),
        "sentencepiece": write("sentencepiece", seed=8, **{"tokenizer.ggml.model": "llama"}),
    }


def refusals(files, draft):
    return draft_refusals(open_gguf(files["target"]).metadata, open_gguf(files[draft]).metadata)


@pytest.mark.parametrize("draft", ["smaller", "other-arch", "larger-vocab"])
def test_drafts_over_the_same_vocabulary_are_accepted(files, draft):
    assert refusals(files, draft) == []


@pytest.mark.parametrize(
    "draft, reason",
    [
        ("much-larger-vocab", "the vocabularies differ in size by more than 128 (288 and 488 tokens)"),
        ("renamed-token", "token 270 differs ("),
        ("adds-bos", "one adds a BOS token to the prompt and the other does not"),
        ("other-eos", "the EOS tokens differ (ids "),
        ("sentencepiece", "the vocabulary types differ (gpt2 and llama)"),
    ],
)
def test_each_refusal_says_why(files, draft, reason):
    reasons = refusals(files, draft)
    assert len(reasons) == 1 and reasons[0].startswith(reason), reasons


def test_the_bundled_models_cannot_draft_for_each_other():
    reasons = draft_refusals(
        open_gguf(bundled_model("smollm2").path).metadata, open_gguf(bundled_model("gemma3").path).metadata
    )
    assert "the vocabulary types differ (gpt2 and llama)" in reasons
    assert any(r.startswith("the vocabularies differ in size by more than 128") for r in reasons)


@pytest.fixture(scope="module")
def pair(files):
    target, draft, refused = (load_model(files[k], "numpy") for k in ("target", "smaller", "renamed-token"))
    yield target, draft, refused
    for model in (target, draft, refused):
        model.close()


def test_check_draft_names_both_files_and_the_reason(pair):
    target, draft, refused = pair
    check_draft(target, draft)  # no error
    with pytest.raises(DraftModelError, match=r"renamed-token.gguf cannot draft for target.gguf: token 270 differs"):
        check_draft(target, refused)


def answer(target, params, speculation=None, max_tokens=24):
    prompt = [10, 20, 30, 40, 50, 60, 70, 80]
    events = list(
        generate(
            target.model,
            target.tokenizer,
            target.new_cache(128),
            prompt,
            params,
            max_tokens=max_tokens,
            ignore_stop_tokens=True,
            speculation=speculation,
        )
    )
    assert speculation is None or events[-1].metrics.drafted_tokens > 0, "the draft model must have drafted"
    return [e.token for e in events]


@pytest.mark.parametrize("params", [SamplingParams.greedy(), SamplingParams(temperature=0.0, repeat_penalty=1.2)])
def test_a_greedy_draft_model_gives_the_plain_answer(pair, params):
    target, draft, _ = pair
    speculation = Speculation("draft", 4, draft=draft)
    assert answer(target, params, speculation) == answer(target, params)
    # The draft model's cache is reused by the next answer, and still agrees.
    assert answer(target, params, speculation) == answer(target, params)


def test_a_sampled_draft_model_drafts_with_its_distribution(pair):
    target, draft, _ = pair
    speculation = Speculation("draft", 3, draft=draft)
    params = SamplingParams(temperature=0.8, seed=4)
    tokens = answer(target, params, speculation, max_tokens=30)
    assert len(tokens) == 30 and all(0 <= t < target.config.vocab_size for t in tokens)
    drafter = speculation.new_drafter(target.model, 128, params)
    draft_out = drafter.propose([10, 20, 30], 3)
    assert draft_out.probs.shape == (3, target.config.vocab_size)
    for token, q in zip(draft_out.tokens, draft_out.probs, strict=True):
        assert q[token] > 0 and abs(q.sum() - 1) < 1e-9


def test_cli_refuses_an_incompatible_draft_model_with_the_reason(files, capsys):
    status = main(
        [
            "generate",
            "--model",
            str(files["target"]),
            "--backend",
            "numpy",
            "--tokens",
            "10,20,30",
            "--max-tokens",
            "4",
            "--speculative",
            "draft",
            "--draft-model",
            str(files["adds-bos"]),
        ]
    )
    assert status == 2
    assert "adds-bos.gguf cannot draft for target.gguf: one adds a BOS token" in capsys.readouterr().err


def test_cli_draft_mode_needs_a_draft_model(files, capsys):
    status = main(
        [
            "generate",
            "--model",
            str(files["target"]),
            "--backend",
            "numpy",
            "--tokens",
            "10,20,30",
            "--speculative",
            "draft",
        ]
    )
    assert status == 2 and "needs a draft model" in capsys.readouterr().err
