"""Before anything imports huggingface_hub: point it at the loopback fake Hub (tests/hub_server.py)."""

import keyring
import pytest
from keyring.backend import KeyringBackend

from tests.hub_server import FakeHub, start  # sets HF_ENDPOINT and a throwaway HF cache for the whole session


@pytest.fixture
def fake_hub() -> FakeHub:
    """The loopback Hub, serving, with no repositories yet (add them to `.repos`)."""
    return start()


class MemoryKeyring(KeyringBackend):
    """A keyring in memory: tests never touch the system's."""

    priority = 1  # type: ignore[assignment]

    def __init__(self):
        super().__init__()
        self.saved: dict[tuple[str, str], str] = {}

    def get_password(self, service, username):
        return self.saved.get((service, username))

    def set_password(self, service, username, password):
        self.saved[(service, username)] = password

    def delete_password(self, service, username):
        self.saved.pop((service, username), None)


@pytest.fixture
def memory_keyring() -> MemoryKeyring:
    """An empty in-memory keyring in place of the system's, for the test's duration."""
    before = keyring.get_keyring()
    backend = MemoryKeyring()
    keyring.set_keyring(backend)
    yield backend
    keyring.set_keyring(before)
