"""API keys of remote servers, kept in the system keyring: never in the database, settings or logs."""

from engine.errors import RemoteError
from engine.keyring_store import keep_secret, read_secret

NO_KEYRING = (
    "The system keyring cannot be used ({reason}), so Sprig cannot keep this server's API key. Set up a keyring "
    "(GNOME Keyring, KWallet, the macOS or Windows one), or use the server without a key."
)


def _account(base_url: str) -> str:
    return f"server:{base_url}"


def api_key(base_url: str) -> str | None:
    """The key kept for the server at `base_url`, or None (also when the keyring cannot be read)."""
    return read_secret(_account(base_url))


def save_api_key(base_url: str, key: str | None) -> None:
    """Keep `key` for the server at `base_url` (None or empty: forget it). Raises RemoteError if the keyring fails."""
    keep_secret(_account(base_url), key, lambda reason: RemoteError(NO_KEYRING.format(reason=reason)))
