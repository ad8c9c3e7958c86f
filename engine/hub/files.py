"""A repository's GGUF files, grouped by quantization, with what is known before downloading.

The Hub's file list (`model_info(files_metadata=True)`) gives every file's size and, for
files in Git LFS, its SHA-256. A model split into `name-00001-of-0000N.gguf` parts is one
choice here, of the parts' total size. Projector files (`mmproj-*`) are not models and
are left out.
"""

import re
from dataclasses import dataclass

from huggingface_hub.hf_api import RepoSibling

from engine.errors import HubError
from engine.hub.connection import Hub, hub_errors, retrying
from engine.hub.search import summary_of

SPLIT = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$", re.IGNORECASE)
# Q4_K_M, IQ2_XXS, Q8_0, Q1_0_G128, TQ1_0, BF16, F16, F32, MXFP4, written in any case.
QUANT = re.compile(r"(?<![A-Z0-9])(I?Q[1-8](?:_[0-9A-Z]{1,4})*|TQ[12]_0|BF16|F16|F32|MXFP4)(?![A-Z0-9_])")
DEFAULT_QUANT = "Q4_K_M"


@dataclass(frozen=True)
class RemoteFile:
    """One file of a repository: its path there, its size, and what its content must hash to."""

    path: str
    size: int
    sha256: str | None  # the LFS object's SHA-256 (nearly every GGUF file)
    blob_id: str | None  # the git blob id, checked instead where the file is not in LFS

    @property
    def etag(self) -> str:
        """The name of its blob in the cache: the SHA-256 for LFS files, else the git blob id."""
        etag = self.sha256 or self.blob_id
        if etag is None:
            raise HubError(f"The Hub gave no checksum for {self.path}: it cannot be verified, so it is not downloaded.")
        return etag


@dataclass(frozen=True)
class GGUFChoice:
    """One model a repository offers: a GGUF file, or all the parts of a split one."""

    quant: str
    parts: tuple[RemoteFile, ...]

    @property
    def size(self) -> int:
        """Bytes of all its parts."""
        return sum(part.size for part in self.parts)

    @property
    def path(self) -> str:
        """The path of its (first) file in the repository."""
        return self.parts[0].path

    @property
    def name(self) -> str:
        """Its file name, with the number of parts if it is split."""
        name = self.path.rsplit("/", 1)[-1]
        return f"{name} (+{len(self.parts) - 1} parts)" if len(self.parts) > 1 else name


@dataclass(frozen=True)
class RepoFiles:
    """A repository's GGUF models at one commit, and what the Hub says about the model."""

    repo_id: str
    commit: str
    choices: tuple[GGUFChoice, ...]  # by quantization, then size
    gated: bool = False
    license: str | None = None
    parameters: int | None = None  # from the Hub's summary of the GGUF files
    architecture: str | None = None
    context_length: int | None = None

    def find(self, quant: str) -> GGUFChoice | None:
        """The choice of quantization `quant` (any case), or None; the smallest where several have it."""
        matches = [c for c in self.choices if c.quant.upper() == quant.upper()]
        return min(matches, key=lambda c: c.size) if matches else None


def quant_of(path: str) -> str:
    """The quantization a GGUF file name says ("Q4_K_M"), from its name or else its folder; "?" if none."""
    for part in reversed(path.split("/")):
        found = QUANT.findall(SPLIT.sub("", part).upper())
        if found:
            return found[-1]
    return "?"


def group_files(files: list[RemoteFile]) -> tuple[GGUFChoice, ...]:
    """GGUF files as models: split parts joined into one choice, projectors left out."""
    groups: dict[str, list[RemoteFile]] = {}
    for file in files:
        name = file.path.rsplit("/", 1)[-1].lower()
        if not name.endswith(".gguf") or name.startswith("mmproj"):
            continue
        groups.setdefault(SPLIT.sub("", file.path), []).append(file)
    choices = [GGUFChoice(quant_of(key), tuple(sorted(parts, key=lambda f: f.path))) for key, parts in groups.items()]
    return tuple(sorted(choices, key=lambda c: (c.quant, c.size)))


def remote_file(sibling: RepoSibling) -> RemoteFile:
    """A RemoteFile from the Hub's description of a file."""
    lfs = sibling.lfs
    return RemoteFile(sibling.rfilename, sibling.size or 0, lfs.sha256 if lfs else None, sibling.blob_id)


def list_gguf_files(hub: Hub, repo_id: str) -> RepoFiles:
    """The GGUF models of `repo_id` on its main branch, with sizes and checksums.

    Raises HubError if the repository holds no GGUF file, and the errors of `hub_errors`.
    """
    api = hub.api()
    with hub_errors(hub, repo_id):
        info = retrying(lambda: api.model_info(repo_id, files_metadata=True), hub.retry_wait_s)
    choices = group_files([remote_file(s) for s in info.siblings or ()])
    if not choices:
        raise HubError(
            f"{repo_id} has no GGUF file: Sprig runs GGUF models only. Search for the model's name with “GGUF” "
            "(many models have a GGUF version by another author), or pick a recommended one."
        )
    gguf = info.gguf or {}
    return RepoFiles(
        repo_id=info.id,
        commit=info.sha or "",
        choices=choices,
        gated=bool(info.gated),
        license=summary_of(info).license,
        parameters=gguf.get("total"),
        architecture=gguf.get("architecture"),
        context_length=gguf.get("context_length"),
    )
