"""POST /v1/embeddings through the official `openai` client and raw HTTP, on the tiny
Qwen3 embedding fixture (last-token pooling); references from transformers."""

import base64
from pathlib import Path

import httpx2 as httpx
import numpy as np
import openai
import pytest

from tests.engine.server.conftest import running_server

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
REFERENCE = np.load(FIXTURES / "reference" / "tiny-embed.npz")
TEXTS = ["The cat sat on the mat.", "A completely different sentence, somewhat longer than the first one.", "hi"]


@pytest.fixture(scope="module")
def server():
    with running_server(FIXTURES / "models" / "tiny-embed-last-f32.gguf", n_ctx=48) as server:
        yield server


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=60)


def test_openai_client_embeds_a_list(client):
    reply = client.embeddings.create(model="tiny", input=TEXTS[:1] + TEXTS[2:])  # the client asks for base64
    assert [d.index for d in reply.data] == [0, 1]
    for d, k in zip(reply.data, (0, 2), strict=True):
        assert float(np.asarray(d.embedding) @ REFERENCE[f"last_{k}"]) > 0.999
    assert reply.usage.prompt_tokens == REFERENCE["ids_0"].size + REFERENCE["ids_2"].size


def test_a_batch_equals_the_single_requests(server):
    url = f"{server.url}/embeddings"
    batch = httpx.post(url, json={"input": TEXTS[:2]}, timeout=60).json()
    for k, text in enumerate(TEXTS[:2]):
        alone = httpx.post(url, json={"input": text}, timeout=60).json()
        assert alone["data"][0]["embedding"] == batch["data"][k]["embedding"]


def test_float_and_base64_agree(server):
    url = f"{server.url}/embeddings"
    floats = httpx.post(url, json={"input": TEXTS[0], "encoding_format": "float"}, timeout=60).json()
    encoded = httpx.post(url, json={"input": TEXTS[0], "encoding_format": "base64"}, timeout=60).json()
    vector = np.frombuffer(base64.b64decode(encoded["data"][0]["embedding"]), dtype="<f4")
    assert vector.tolist() == pytest.approx(floats["data"][0]["embedding"], abs=0)
    assert floats["object"] == "list" and floats["data"][0]["object"] == "embedding"


@pytest.mark.parametrize("body", [
    {"input": []},
    {"input": ""},
    {"input": ["fine", ""]},
    {"input": [1, 2, 3]},
    {"input": [[1, 2], [3]]},
    {"input": ["fine", 5]},
    {"input": 5},
    {"input": "word " * 100},  # past the server's 48-token context
    {"input": "fine", "encoding_format": "int8"},
    {"input": "fine", "dimensions": 12},
    {"text": "fine"},
])
def test_bad_inputs_get_400(server, body):
    reply = httpx.post(f"{server.url}/embeddings", json=body, timeout=60)
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["message"]


def test_client_raises_bad_request(client):
    with pytest.raises(openai.BadRequestError):
        client.embeddings.create(model="tiny", input=[])


def test_a_bert_server_answers_the_openai_client():
    """BERT (CLS pooling, WordPiece) through the server, as a RAG tool would call it."""
    reference = np.load(FIXTURES / "reference" / "tiny-bert.npz")
    with running_server(FIXTURES / "models" / "tiny-bert-cls-f32.gguf", n_ctx=64) as server:
        bert = openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=60)
        reply = bert.embeddings.create(model="tiny-bert", input=TEXTS)
    for d, k in zip(reply.data, range(3), strict=True):
        assert float(np.asarray(d.embedding) @ reference[f"cls_{k}"]) > 0.999
    assert reply.usage.prompt_tokens == sum(reference[f"ids_{k}"].size for k in range(3))
