"""The local server's API key, kept in the system keyring (never in the database, settings or logs).

A keyring that cannot be used is said in words; the server then cannot be opened to the network.
"""

from engine.errors import SprigError
from engine.keyring_store import keep_secret, read_secret

ACCOUNT = "local-server-api-key"
NO_KEYRING = "The system keyring cannot be used ({reason}), so Sprig cannot keep the server's API key."


class ServerKeyError(SprigError):
    """The API key could not be kept or removed."""


def stored_key() -> str | None:
    """The key saved in the keyring, or None (also when the keyring cannot be read)."""
    return read_secret(ACCOUNT)


def save_key(key: str | None) -> None:
    """Keep `key` in the keyring; an empty or None key removes the one kept. Raises ServerKeyError."""
    keep_secret(ACCOUNT, key, lambda reason: ServerKeyError(NO_KEYRING.format(reason=reason)))
