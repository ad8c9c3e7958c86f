"""Secrets in the keyring: kept stripped, removed when blank, and a keyring that cannot be
used reads as no secret and fails writes with the caller's words, never the secret."""

import keyring
import pytest
from keyring.backend import KeyringBackend
from keyring.errors import KeyringLocked, PasswordDeleteError

from engine.errors import HubError, RemoteError
from engine.hub import tokens
from engine.keyring_store import SERVICE, keep_secret, read_secret
from engine.remote import keys


class LockedKeyring(KeyringBackend):
    """A keyring that refuses everything, as a locked one does."""

    priority = 1  # type: ignore[assignment]

    def get_password(self, service, username):
        raise KeyringLocked("locked; last value was sk-secret")

    def set_password(self, service, username, password):
        raise KeyringLocked(f"locked; refused {password}")

    def delete_password(self, service, username):
        raise KeyringLocked("locked")


@pytest.fixture
def locked_keyring():
    before = keyring.get_keyring()
    keyring.set_keyring(LockedKeyring())
    yield
    keyring.set_keyring(before)


def test_a_secret_is_kept_stripped_and_a_blank_one_removes_it(memory_keyring):
    keep_secret("a", "  sk-1\n", RuntimeError)
    assert memory_keyring.saved == {(SERVICE, "a"): "sk-1"} and read_secret("a") == "sk-1"
    keep_secret("a", "   ", RuntimeError)
    assert memory_keyring.saved == {} and read_secret("a") is None
    keep_secret("a", None, RuntimeError)  # nothing kept: removing it again is fine


def test_removing_what_the_keyring_never_had_is_not_an_error(memory_keyring, monkeypatch):
    def missing(service, username):
        raise PasswordDeleteError("no such password")

    monkeypatch.setattr(memory_keyring, "delete_password", missing)
    tokens.forget_token()
    keys.save_api_key("http://a/v1", "")


def test_a_locked_keyring_reads_as_nothing_and_refuses_writes_in_words(locked_keyring):
    assert read_secret("a") is None and tokens.stored_token() is None and keys.api_key("http://a/v1") is None
    with pytest.raises(HubError, match=r"keyring cannot be used \(KeyringLocked\).*HF_TOKEN") as hub_error:
        tokens.save_token("hf_s3cret")
    with pytest.raises(RemoteError, match=r"keyring cannot be used \(KeyringLocked\)") as remote_error:
        keys.save_api_key("http://a/v1", "sk-secret")
    for error in (hub_error.value, remote_error.value):
        assert "s3cret" not in str(error) and "sk-secret" not in str(error)
        assert error.__cause__ is None and error.__suppress_context__  # the keyring's message stays out
