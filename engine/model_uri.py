"""A model named by a URI, so a conversation can say which model it talks to, wherever it runs.

- a local file: its `file://` URI (`Path.as_uri()`), e.g. ``file:///home/me/models/smollm2.gguf``;
- a model on a remote OpenAI-compatible server: ``openai+`` and the server's base URL, and
  the model id as the fragment, e.g. ``openai+http://10.0.0.5:8000/v1#Qwen%2FQwen3-8B``.
"""

from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote, unquote, urlsplit

REMOTE_PREFIX = "openai+"


@dataclass(frozen=True)
class ModelRef:
    """What a model URI names: a local file (`path`), or a server's base URL and a model id."""

    path: Path | None = None
    base_url: str | None = None
    model_id: str | None = None

    @property
    def is_remote(self) -> bool:
        """Whether the model is on a remote server."""
        return self.base_url is not None


def local_uri(path: str | Path) -> str:
    """The URI of a local model file (made absolute)."""
    return Path(path).absolute().as_uri()


def remote_uri(base_url: str, model_id: str) -> str:
    """The URI of model `model_id` on the server at `base_url`."""
    return f"{REMOTE_PREFIX}{base_url}#{quote(model_id, safe='')}"


def parse_model_uri(uri: str) -> ModelRef:
    """The model a URI names; ValueError for a URI that is neither form."""
    if uri.startswith(REMOTE_PREFIX):
        base_url, hash_, model_id = uri[len(REMOTE_PREFIX) :].partition("#")
        if not hash_ or not model_id or urlsplit(base_url).scheme not in ("http", "https"):
            raise ValueError(f"not a remote model URI (openai+http(s)://…/v1#model): {uri!r}")
        return ModelRef(base_url=base_url, model_id=unquote(model_id))
    parts = urlsplit(uri)
    if parts.scheme != "file":
        raise ValueError(f"not a model URI (file:// or openai+http(s)://): {uri!r}")
    return ModelRef(path=Path(unquote(parts.path)))
