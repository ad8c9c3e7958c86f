"""Gemma 4 through the server: the tiny dense and MoE files (llama.cpp's converter and
quantizer wrote them) answer, stream the same text, and decode two clients in one batch as
each alone, on the cpu backend."""

import pytest

from tests.engine.server import test_moe_serving as moe
from tests.engine.server.conftest import running_server

FIXTURES = moe.FIXTURES


@pytest.fixture(scope="module", params=["tiny-gemma4-q4_k_m", "tiny-gemma4-moe-q8_0"])
def server(request):
    with running_server(FIXTURES / f"{request.param}.gguf", backend="cpu") as running:
        yield running


def test_gemma4_answers_and_streams_the_same_text(server):
    moe.test_an_moe_model_answers_and_streams_the_same_text(server)


def test_two_clients_decode_together_as_each_alone(server):
    moe.test_two_clients_decode_together_as_each_alone(server)
