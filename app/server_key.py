"""The local server's API key, kept in the system keyring (never in the database, settings or logs).

A keyring that cannot be used is said in words; the server then cannot be opened to the network.
"""

import keyring
from keyring.errors import KeyringError, PasswordDeleteError

from engine.errors import SprigError

SERVICE = "Sprig"
ACCOUNT = "local-server-api-key"
NO_KEYRING = "The system keyring cannot be used ({reason}), so Sprig cannot keep the server's API key."


class ServerKeyError(SprigError):
    """The API key could not be kept or removed."""


def stored_key() -> str | None:
    """The key saved in the keyring, or None (also when the keyring cannot be read)."""
    try:
        return keyring.get_password(SERVICE, ACCOUNT) or None
    except KeyringError:
        return None


def save_key(key: str | None) -> None:
    """Keep `key` in the keyring; an empty or None key removes the one kept. Raises ServerKeyError."""
    key = (key or "").strip()
    try:
        if key:
            keyring.set_password(SERVICE, ACCOUNT, key)
        else:
            keyring.delete_password(SERVICE, ACCOUNT)
    except PasswordDeleteError:
        pass
    except KeyringError as exc:
        raise ServerKeyError(NO_KEYRING.format(reason=type(exc).__name__)) from None  # the cause could echo the key
