"""API keys of remote servers, kept in the system keyring: never in the database, settings or logs."""

import keyring
from keyring.errors import KeyringError, PasswordDeleteError

from engine.errors import RemoteError

SERVICE = "Sprig"
NO_KEYRING = (
    "The system keyring cannot be used ({reason}), so Sprig cannot keep this server's API key. Set up a keyring "
    "(GNOME Keyring, KWallet, the macOS or Windows one), or use the server without a key."
)


def _account(base_url: str) -> str:
    return f"server:{base_url}"


def api_key(base_url: str) -> str | None:
    """The key kept for the server at `base_url`, or None (also when the keyring cannot be read)."""
    try:
        return keyring.get_password(SERVICE, _account(base_url)) or None
    except KeyringError:
        return None


def save_api_key(base_url: str, key: str | None) -> None:
    """Keep `key` for the server at `base_url` (None or empty: forget it). Raises RemoteError if the keyring fails."""
    try:
        if key and key.strip():
            keyring.set_password(SERVICE, _account(base_url), key.strip())
        else:
            keyring.delete_password(SERVICE, _account(base_url))
    except PasswordDeleteError:
        pass
    except KeyringError as exc:
        raise RemoteError(NO_KEYRING.format(reason=type(exc).__name__)) from None  # the cause could echo the key
