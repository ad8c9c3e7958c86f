"""Finding GGUF repositories: a few recommended starting points, and search of the Hub.

The recommendations are fixed here, so the view shows them offline too.
"""

from dataclasses import dataclass
from datetime import datetime

from huggingface_hub.hf_api import ExpandModelProperty_T
from huggingface_hub.hf_api import ModelInfo as HubModelInfo

from engine.hub.connection import Hub, hub_errors

SEARCH_LIMIT = 50
SEARCH_FIELDS: list[ExpandModelProperty_T] = ["downloads", "likes", "lastModified", "tags", "gated"]


@dataclass(frozen=True)
class RepoSummary:
    """One repository in a list: its id, its figures on the Hub, and why it is recommended."""

    repo_id: str
    downloads: int | None = None
    likes: int | None = None
    last_modified: datetime | None = None
    license: str | None = None
    gated: bool = False
    why: str = ""


RECOMMENDED = (
    RepoSummary(
        "bartowski/Llama-3.2-1B-Instruct-GGUF",
        license="llama3.2",
        why="Small and fast: Llama 3.2 1B answers quickly on any laptop (about 0.8 GB at Q4_K_M).",
    ),
    RepoSummary(
        "unsloth/Qwen3-4B-GGUF",
        license="apache-2.0",
        why="A good 4B: Qwen3 reasons and chats well for its size (about 2.5 GB at Q4_K_M).",
    ),
    RepoSummary(
        "bartowski/Qwen2.5-Coder-7B-Instruct-GGUF",
        license="apache-2.0",
        why="For code: Qwen2.5-Coder 7B writes, explains and fixes code (about 4.7 GB at Q4_K_M).",
    ),
    RepoSummary(
        "prism-ml/Bonsai-8B-gguf",
        license="apache-2.0",
        why="1-bit Bonsai: an 8B model in 1.15 GB (Q1_0), run by Sprig's own 1-bit kernels.",
    ),
    RepoSummary(
        "unsloth/Qwen3-30B-A3B-GGUF",
        license="apache-2.0",
        why=(
            "A mixture of experts for machines with RAM to spare (32 GB+): 30B weights, 3B at work per token, "
            "so it answers about as fast as a 3B model."
        ),
    ),
)


def summary_of(info: HubModelInfo) -> RepoSummary:
    """A RepoSummary from the Hub's model info (the licence from its `license:` tag)."""
    licence = next((tag.removeprefix("license:") for tag in info.tags or () if tag.startswith("license:")), None)
    return RepoSummary(
        repo_id=info.id,
        downloads=info.downloads,
        likes=info.likes,
        last_modified=info.last_modified,
        license=licence,
        gated=bool(info.gated),
    )


def search_models(hub: Hub, query: str, limit: int = SEARCH_LIMIT) -> list[RepoSummary]:
    """GGUF repositories whose name contains `query`, most downloaded first."""
    api = hub.api()
    with hub_errors(hub, f"search {query!r}"):  # the library itself retries 429, 5xx and network errors
        found = list(api.list_models(search=query, filter="gguf", sort="downloads", limit=limit, expand=SEARCH_FIELDS))
    return [summary_of(info) for info in found]
