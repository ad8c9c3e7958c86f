"""The Hugging Face access token, kept in the system keyring (never in the database, settings or logs).

Without a token saved here, `huggingface_hub` uses its own: HF_TOKEN, or the one
`hf auth login` saved. A keyring that cannot be used is said in words: the token then
goes in HF_TOKEN instead.
"""

from engine.errors import HubError
from engine.keyring_store import keep_secret, read_secret

ACCOUNT = "huggingface-token"
NO_KEYRING = (
    "The system keyring cannot be used ({reason}), so Sprig cannot keep the token. Set the HF_TOKEN environment "
    "variable to it instead, or run `hf auth login`."
)


def _unusable(reason: str) -> HubError:
    return HubError(NO_KEYRING.format(reason=reason))


def stored_token() -> str | None:
    """The token saved in the keyring, or None (also when the keyring cannot be read)."""
    return read_secret(ACCOUNT)


def save_token(token: str) -> None:
    """Keep `token` in the keyring; raises HubError if it is empty or the keyring is unusable."""
    if not token.strip():
        raise HubError("The token is empty: paste the token from huggingface.co/settings/tokens.")
    keep_secret(ACCOUNT, token, _unusable)


def forget_token() -> None:
    """Remove the saved token, if any."""
    keep_secret(ACCOUNT, None, _unusable)
