"""Talking to the Hugging Face Hub: which cache and token, offline or not, retries, errors in words.

`huggingface_hub` reads `HF_ENDPOINT`, `HF_HUB_CACHE` (or `HF_HOME`) and `HF_HUB_OFFLINE`
when it is imported; `Hub` takes its defaults from there, so Sprig, llama.cpp and the
`hf` command line share one cache. `hub_errors` turns the library's exceptions into
`engine.errors.HubError`s whose messages say what happened and what the user can do.
"""

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import httpx2
from huggingface_hub import HfApi, constants
from huggingface_hub.errors import (
    GatedRepoError,
    HfHubHTTPError,
    HFValidationError,
    LocalEntryNotFoundError,
    OfflineModeIsEnabled,
    RemoteEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

from engine.errors import HubAccessError, HubError, HubOfflineError

RETRY_STATUSES = (429, 500, 502, 503, 504)
RETRIES = 4  # after the first try: 1 + 2 + 4 + 8 seconds of waiting at most
RETRY_WAIT_S = 1.0  # the first wait; it doubles after each failure
NETWORK_ERRORS = (httpx2.TransportError, OfflineModeIsEnabled)
T = TypeVar("T")


def default_cache_dir() -> Path:
    """The Hugging Face cache `huggingface_hub` uses (HF_HUB_CACHE, else HF_HOME/hub, else ~/.cache/huggingface/hub)."""
    return Path(constants.HF_HUB_CACHE)


@dataclass(frozen=True)
class Hub:
    """Where downloads go, which token to send, and whether the network may be used.

    `token` None lets `huggingface_hub` use its own (HF_TOKEN, or `hf auth login`).
    `offline` is the user's setting; HF_HUB_OFFLINE=1 also makes every Hub call offline.
    """

    cache_dir: Path = field(default_factory=default_cache_dir)
    token: str | None = None
    offline: bool = False
    retry_wait_s: float = RETRY_WAIT_S  # the first wait before a retry; it doubles after each failure
    endpoint: str = field(default_factory=lambda: constants.ENDPOINT)  # HF_ENDPOINT, else https://huggingface.co

    @property
    def is_offline(self) -> bool:
        """True if no Hub call may be made (the user's setting or HF_HUB_OFFLINE)."""
        return self.offline or constants.is_offline_mode()

    def api(self) -> HfApi:
        """An HfApi client with this token; raises HubOfflineError when offline."""
        self.check_online()
        return HfApi(endpoint=self.endpoint, token=self.token)

    def check_online(self) -> None:
        """Raise HubOfflineError if the Hub may not be used."""
        if self.is_offline:
            raise HubOfflineError(
                "Offline mode is on (Settings → Hugging Face, or HF_HUB_OFFLINE=1): searching and downloading need "
                "the network. Models already downloaded are listed and can be loaded."
            )

    def repo_url(self, repo_id: str) -> str:
        """The repository's page on the Hub (where a gated model's licence is accepted)."""
        return f"{self.endpoint}/{repo_id}"


def retrying(call: Callable[[], T], wait: float = RETRY_WAIT_S) -> T:
    """`call()`, tried again after `wait` seconds, doubling, while the Hub answers 429 or 5xx."""
    for _attempt in range(RETRIES):
        try:
            return call()
        except HfHubHTTPError as exc:
            if exc.response is None or exc.response.status_code not in RETRY_STATUSES:
                raise
        time.sleep(wait)
        wait *= 2
    return call()


def status_message(status: int, what: str) -> str | None:
    """The sentence for a Hub status that stayed after the retries (429, 5xx), else None."""
    if status == 429:
        return (
            f"The Hugging Face Hub is limiting requests (429 Too Many Requests) for {what}, even after several "
            "retries. Wait a few minutes and try again; signing in with a token raises the limit."
        )
    if status >= 500:
        return (
            f"The Hugging Face Hub had a server error ({status}) for {what}, even after several retries. "
            "It is probably temporary: try again in a few minutes."
        )
    return None


@contextmanager
def hub_errors(hub: Hub, repo_id: str, filename: str | None = None) -> Iterator[None]:
    """Translate `huggingface_hub` and network errors inside the block into HubErrors for `repo_id`."""
    what = f"{repo_id}/{filename}" if filename else repo_id
    try:
        yield
    except GatedRepoError as exc:
        raise HubAccessError(access_message(hub, repo_id, gated=True)) from exc
    except RemoteEntryNotFoundError as exc:
        raise HubError(f"{repo_id} has no file {filename or ''} (404): the repository may have changed.") from exc
    except RevisionNotFoundError as exc:
        raise HubError(f"{repo_id} has no such revision (404).") from exc
    except RepositoryNotFoundError as exc:  # the Hub answers 401 for missing and for private repositories alike
        raise HubError(
            f"{repo_id} was not found on the Hugging Face Hub (404). Check the name (owner/name, as in the "
            "address of its page); if it is private, add an access token that can read it."
        ) from exc
    except HFValidationError as exc:
        raise HubError(
            f"{repo_id!r} is not a repository name: write it as owner/name, e.g. unsloth/Qwen3-4B-GGUF."
        ) from exc
    except HfHubHTTPError as exc:
        status = exc.response.status_code if exc.response is not None else 0
        if status in (401, 403):
            raise HubAccessError(access_message(hub, repo_id, gated=False)) from exc
        raise HubError(status_message(status, what) or f"The Hugging Face Hub refused {what} ({status}).") from exc
    except (LocalEntryNotFoundError, *NETWORK_ERRORS) as exc:
        raise HubOfflineError(
            f"Cannot reach the Hugging Face Hub ({hub.endpoint}) for {what}: no network? Check the connection "
            "and try again. Models already downloaded are listed and can be loaded."
        ) from exc


def access_message(hub: Hub, repo_id: str, gated: bool) -> str:
    """What to do about a 401/403: accept the licence on the repository's page, add a token."""
    token_state = "The token you gave was refused" if hub.token else "No access token is set"
    why = "is gated: its authors ask you to accept their licence first" if gated else "needs permission to read"
    return (
        f"{repo_id} {why}. {token_state}. Open {hub.repo_url(repo_id)}, sign in and accept the licence; then "
        f"create a read token at {hub.endpoint}/settings/tokens and add it (Get models → Add token, or "
        f"`sprig pull --token {repo_id}`). Sprig keeps it in the system keyring."
    )
