"""Before anything imports huggingface_hub: point it at the loopback fake Hub (tests/hub_server.py)."""

import pytest

from tests.hub_server import FakeHub, start  # sets HF_ENDPOINT and a throwaway HF cache for the whole session


@pytest.fixture
def fake_hub() -> FakeHub:
    """The loopback Hub, serving, with no repositories yet (add them to `.repos`)."""
    return start()
