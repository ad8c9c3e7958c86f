"""Secrets (API keys, access tokens) kept in the system keyring: never in the database, settings or logs.

Every secret is kept under the service "Sprig", one account each. A keyring that cannot be
read reads as no secret; one that cannot be written raises the caller's error, worded by the
caller and without its cause, which could echo the secret.
"""

from collections.abc import Callable

import keyring
from keyring.errors import KeyringError, PasswordDeleteError

SERVICE = "Sprig"


def read_secret(account: str) -> str | None:
    """The secret kept for `account`, or None (also when the keyring cannot be read)."""
    try:
        return keyring.get_password(SERVICE, account) or None
    except KeyringError:
        return None


def keep_secret(account: str, secret: str | None, unusable: Callable[[str], Exception]) -> None:
    """Keep `secret` (stripped) for `account`; None or blank removes the one kept, if any.

    A keyring that cannot be used raises `unusable(reason)`, the reason being the keyring
    error's class name.
    """
    secret = (secret or "").strip()
    try:
        if secret:
            keyring.set_password(SERVICE, account, secret)
        else:
            keyring.delete_password(SERVICE, account)
    except PasswordDeleteError:
        return  # nothing was kept
    except KeyringError as exc:
        raise unusable(type(exc).__name__) from None  # the cause could echo the secret
