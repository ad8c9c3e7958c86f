"""A remote server the user added, and the presets the "Add a server" form starts from."""

from dataclasses import dataclass
from urllib.parse import urlsplit

from engine.errors import RemoteError


@dataclass(frozen=True)
class Preset:
    """A kind of server: its usual base URL, and whether it takes sampling fields beyond OpenAI's."""

    name: str
    base_url: str
    extended_sampling: bool = True  # top_k, min_p, repeat_penalty


PRESETS: tuple[Preset, ...] = (
    Preset("llama.cpp server", "http://127.0.0.1:8080/v1"),
    Preset("vLLM", "http://127.0.0.1:8000/v1"),
    Preset("SGLang", "http://127.0.0.1:30000/v1"),
    Preset("Ollama", "http://127.0.0.1:11434/v1", extended_sampling=False),
    Preset("LM Studio", "http://127.0.0.1:1234/v1", extended_sampling=False),
    Preset("Sprig", "http://127.0.0.1:8080/v1"),
    Preset("OpenAI", "https://api.openai.com/v1", extended_sampling=False),
    Preset("OpenRouter", "https://openrouter.ai/api/v1", extended_sampling=False),
)


@dataclass(frozen=True)
class Endpoint:
    """A server the user added. Its API key is not here: it lives in the keyring (`engine.remote.keys`).

    `verify_tls` False accepts a self-signed certificate, for this server only, when the user said so.
    `extended_sampling` sends top_k, min_p and repeat_penalty too, and vLLM's continue_final_message to go
    on with an answer (servers that take them).
    """

    name: str
    base_url: str
    verify_tls: bool = True
    extended_sampling: bool = True


def normalize_base_url(url: str) -> str:
    """`url` as OpenAI clients take it (scheme, host, the path up to /v1), without a trailing slash.

    Raises RemoteError for what cannot be a server's address.
    """
    url = url.strip().rstrip("/")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise RemoteError(
            f"“{url}” is not a server address: write it as http://host:port/v1 (or https://…), the way OpenAI "
            "clients take it."
        )
    if parts.query or parts.fragment:
        raise RemoteError(f"“{url}” has a query or fragment; a base URL is just http(s)://host:port/path.")
    return url
