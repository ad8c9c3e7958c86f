"""The mixture-of-experts families through the server: a Qwen3-MoE and a gpt-oss file (the
tiny fixtures llama.cpp's converter wrote) answer, stream, and decode two clients in one
batch as each alone, on the cpu backend."""

import threading
from pathlib import Path

import openai
import pytest

from tests.engine.server.conftest import running_server

FIXTURES = Path(__file__).resolve().parent.parent.parent / "fixtures" / "models"
MESSAGES = [{"role": "user", "content": "the town stood where two rivers met, the town stood where"}]


@pytest.fixture(scope="module", params=["tiny-qwen3moe-q8_0", "tiny-gpt-oss-mxfp4"])
def server(request):
    with running_server(FIXTURES / f"{request.param}.gguf", backend="cpu") as running:
        yield running


def ask(server, **options):
    client = openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0)
    return client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=10, temperature=0, **options)


def test_an_moe_model_answers_and_streams_the_same_text(server):
    whole = ask(server)
    assert whole.usage.completion_tokens > 0
    streamed = "".join(chunk.choices[0].delta.content or "" for chunk in ask(server, stream=True) if chunk.choices)
    assert streamed == whole.choices[0].message.content


def test_two_clients_decode_together_as_each_alone(server):
    alone = ask(server).choices[0].message.content
    answers: list[str] = []
    threads = [threading.Thread(target=lambda: answers.append(ask(server).choices[0].message.content))
               for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert answers == [alone, alone]
