"""Embeddings against transformers' (tools/fixtures/make_lora_embedding_fixtures.py): tiny Qwen3
files converted by llama.cpp with last-token, mean and CLS pooling, on NumPy and cpu."""

import json
from pathlib import Path

import numpy as np
import pytest

from engine import cli
from engine.embedding import EmbeddingError, embed, embedding_tokens, pooling
from engine.loader import load_model

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
REFERENCE = np.load(FIXTURES / "reference" / "tiny-embed.npz")
TEXTS = ["The cat sat on the mat.", "A completely different sentence, somewhat longer than the first one.", "hi"]


def model_path(how: str) -> Path:
    return FIXTURES / "models" / f"tiny-embed-{how}-f32.gguf"


@pytest.mark.parametrize("backend", ["numpy", "cpu"])
@pytest.mark.parametrize("how", ["last", "mean", "cls"])
def test_vectors_match_transformers(how, backend):
    loaded = load_model(model_path(how), backend)
    try:
        assert pooling(loaded) == how
        for k, text in enumerate(TEXTS):
            assert embedding_tokens(loaded, text) == REFERENCE[f"ids_{k}"].tolist()  # EOS appended, as the file says
        vectors, n_tokens = embed(loaded, TEXTS)
        assert n_tokens == sum(REFERENCE[f"ids_{k}"].size for k in range(len(TEXTS)))
        for k, vector in enumerate(vectors):
            assert np.linalg.norm(vector) == pytest.approx(1.0, abs=1e-5)
            assert float(vector @ REFERENCE[f"{how}_{k}"]) > 0.999
        # the poolings differ: a wrong one would not pass the check above
        other = {"last": "mean", "mean": "cls", "cls": "last"}[how]
        assert float(vectors[1] @ REFERENCE[f"{other}_1"]) < 0.99
    finally:
        loaded.close()


def test_bad_inputs_are_refused():
    loaded = load_model(model_path("last"), "numpy")
    try:
        with pytest.raises(EmbeddingError, match="empty"):
            embed(loaded, ["fine", ""])  # the EOS alone is not empty: the text must have tokens
        with pytest.raises(EmbeddingError, match="at most 5"):
            embed(loaded, ["a sentence long enough to pass five tokens"], limit=5)
    finally:
        loaded.close()


def test_embed_command(capsys):
    assert cli.main(["embed", "--model", str(model_path("mean")), "--backend", "numpy", "--text", TEXTS[0],
                     "--text", TEXTS[2], "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["pooling"] == "mean" and len(out["embeddings"]) == 2
    assert float(np.asarray(out["embeddings"][1]) @ REFERENCE["mean_2"]) > 0.999


GEMMA = FIXTURES / "models" / "tiny-embeddinggemma-f32.gguf"
GEMMA_REFERENCE = np.load(FIXTURES / "reference" / "tiny-embeddinggemma.npz")


def skip_without(backend: str) -> None:
    if backend == "mlx":
        pytest.importorskip("mlx.core", reason="mlx is not installed (pip install 'sprig[mlx]')")


@pytest.mark.parametrize("backend", ["numpy", "cpu", "mlx"])
def test_embeddinggemma_matches_sentence_transformers(backend):
    """Bidirectional attention with a symmetric window (the long text crosses it), mean
    pooling and the two dense projections, against sentence-transformers."""
    skip_without(backend)
    loaded = load_model(GEMMA, backend)
    try:
        assert pooling(loaded) == "mean" and not loaded.model.causal
        for k, text in enumerate(TEXTS):
            assert embedding_tokens(loaded, text) == GEMMA_REFERENCE[f"ids_{k}"].tolist()  # BOS and EOS
        vectors, _ = embed(loaded, TEXTS)
        for k, vector in enumerate(vectors):
            assert float(vector @ GEMMA_REFERENCE[f"vector_{k}"]) > 0.999
        # the projections matter: the pooled state alone is far from the reference
        assert float(GEMMA_REFERENCE["no_dense_1"] @ GEMMA_REFERENCE["vector_1"]) < 0.9
    finally:
        loaded.close()


def test_embeddinggemma_attention_is_bidirectional():
    """The first token's state depends on the tokens after it (a causal model's would not)."""
    loaded = load_model(GEMMA, "numpy")
    try:
        tokens = GEMMA_REFERENCE["ids_1"].tolist()
        model = loaded.model

        def first_state(ids):
            return model.hidden_states(ids, 0, model.backend.allocate_state(model.layer_states(len(ids))))[0]

        assert np.abs(first_state(tokens) - first_state(tokens[:3])).max() > 1e-3
    finally:
        loaded.close()


BERT_REFERENCE = np.load(FIXTURES / "reference" / "tiny-bert.npz")


@pytest.mark.parametrize("backend", ["numpy", "cpu", "mlx"])
@pytest.mark.parametrize("how", ["cls", "mean"])
def test_bert_matches_sentence_transformers(how, backend):
    """BERT's WordPiece ids ([CLS] ... [SEP]) and vectors, CLS or mean pooled as the file says."""
    skip_without(backend)
    loaded = load_model(FIXTURES / "models" / f"tiny-bert-{how}-f32.gguf", backend)
    try:
        assert pooling(loaded) == how
        for k, text in enumerate(TEXTS):
            assert embedding_tokens(loaded, text) == BERT_REFERENCE[f"ids_{k}"].tolist()
        vectors, _ = embed(loaded, TEXTS)
        for k, vector in enumerate(vectors):
            assert float(vector @ BERT_REFERENCE[f"{how}_{k}"]) > 0.999
        other = {"cls": "mean", "mean": "cls"}[how]
        assert float(vectors[1] @ BERT_REFERENCE[f"{other}_1"]) < 0.99
    finally:
        loaded.close()


def test_bert_refuses_a_text_past_its_positions():
    loaded = load_model(FIXTURES / "models" / "tiny-bert-cls-f32.gguf", "numpy")
    try:
        with pytest.raises(EmbeddingError, match="at most 64"):
            embed(loaded, ["word " * 70])  # 64 rows of position_embd
    finally:
        loaded.close()


def test_embed_command_with_bert(capsys):
    assert cli.main(["embed", "--model", str(FIXTURES / "models" / "tiny-bert-mean-f32.gguf"), "--backend", "cpu",
                     "--text", TEXTS[1], "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["pooling"] == "mean"
    assert float(np.asarray(out["embeddings"][0]) @ BERT_REFERENCE["mean_1"]) > 0.999
