"""The Hugging Face access token, kept in the system keyring (never in the database, settings or logs).

Without a token saved here, `huggingface_hub` uses its own: HF_TOKEN, or the one
`hf auth login` saved. A keyring that cannot be used is said in words: the token then
goes in HF_TOKEN instead.
"""

import keyring
from keyring.errors import KeyringError, PasswordDeleteError

from engine.errors import HubError

SERVICE = "Sprig"
ACCOUNT = "huggingface-token"
NO_KEYRING = (
    "The system keyring cannot be used ({reason}), so Sprig cannot keep the token. Set the HF_TOKEN environment "
    "variable to it instead, or run `hf auth login`."
)


def stored_token() -> str | None:
    """The token saved in the keyring, or None (also when the keyring cannot be read)."""
    try:
        return keyring.get_password(SERVICE, ACCOUNT) or None
    except KeyringError:
        return None


def save_token(token: str) -> None:
    """Keep `token` in the keyring; raises HubError if it is empty or the keyring is unusable."""
    token = token.strip()
    if not token:
        raise HubError("The token is empty: paste the token from huggingface.co/settings/tokens.")
    try:
        keyring.set_password(SERVICE, ACCOUNT, token)
    except KeyringError as exc:
        raise HubError(NO_KEYRING.format(reason=type(exc).__name__)) from None  # the cause could echo the token


def forget_token() -> None:
    """Remove the saved token, if any."""
    try:
        keyring.delete_password(SERVICE, ACCOUNT)
    except PasswordDeleteError:
        pass
    except KeyringError as exc:
        raise HubError(NO_KEYRING.format(reason=type(exc).__name__)) from None
