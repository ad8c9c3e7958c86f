"""The GGUF models in the Hugging Face cache (downloaded by Sprig or by any other tool), and deleting one.

Listing reads the cache with `huggingface_hub.scan_cache_dir`, which needs no network:
this is what the Get models view shows offline. A split model is listed once, by its
first part, and only when all its parts are there.
"""

import shutil
from dataclasses import dataclass
from pathlib import Path

from huggingface_hub import scan_cache_dir
from huggingface_hub.errors import CacheNotFound

from engine.hub.files import SPLIT, quant_of


@dataclass(frozen=True)
class CachedModel:
    """A model in the cache: its repository and commit, its files there, their blobs and size."""

    repo_id: str
    commit: str
    quant: str
    parts: tuple[Path, ...]  # the snapshot paths; the first is the one to load
    blobs: tuple[Path, ...]
    size: int

    @property
    def path(self) -> Path:
        """The file to load (the first part of a split model)."""
        return self.parts[0]

    @property
    def name(self) -> str:
        """A name for the library: the file's name without `.gguf` or its split suffix."""
        return SPLIT.sub("", self.path.name).removesuffix(".gguf")


def cached_models(cache_dir: Path) -> list[CachedModel]:
    """Every complete GGUF model in the cache at `cache_dir`, by repository and file name."""
    try:
        info = scan_cache_dir(cache_dir)
    except CacheNotFound:
        return []
    models = []
    for repo in sorted(info.repos, key=lambda r: r.repo_id):
        if repo.repo_type != "model":
            continue
        for revision in repo.revisions:
            groups: dict[str, list] = {}
            for file in revision.files:
                name = file.file_name.lower()
                if name.endswith(".gguf") and not name.startswith("mmproj"):
                    relative = file.file_path.relative_to(revision.snapshot_path).as_posix()
                    groups.setdefault(SPLIT.sub("", relative), []).append(file)
            for key, files in sorted(groups.items()):
                files.sort(key=lambda f: f.file_name)
                split = SPLIT.search(files[0].file_name)
                if split and len(files) != int(split.group(2)):
                    continue  # some parts are missing: not a usable model (yet)
                models.append(
                    CachedModel(
                        repo_id=repo.repo_id,
                        commit=revision.commit_hash,
                        quant=quant_of(key),
                        parts=tuple(f.file_path for f in files),
                        blobs=tuple(f.blob_path for f in files),
                        size=sum(f.size_on_disk for f in files),
                    )
                )
    return models


def find_cached(cache_dir: Path, path: Path) -> CachedModel | None:
    """The cached model one of whose files is `path`, or None if `path` is not in the cache."""
    return next((m for m in cached_models(cache_dir) if path in m.parts), None)


def delete_download(cache_dir: Path, model: CachedModel) -> None:
    """Delete a downloaded model: its snapshot files, and their blobs unless another snapshot uses them."""
    others = {
        file.blob_path
        for repo in scan_cache_dir(cache_dir).repos
        for revision in repo.revisions
        for file in revision.files
        if file.file_path not in model.parts
    }
    for part, blob in zip(model.parts, model.blobs, strict=True):
        part.unlink(missing_ok=True)
        if blob not in others:
            blob.unlink(missing_ok=True)
    folder = model.path.parent
    while folder.name != "snapshots" and folder.is_dir() and not any(folder.iterdir()):
        folder.rmdir()  # an emptied snapshot leaves no folder behind
        folder = folder.parent
    repo, blobs = folder.parent, folder.parent / "blobs"
    if folder.name == "snapshots" and not any(folder.iterdir()) and not (blobs.is_dir() and any(blobs.iterdir())):
        shutil.rmtree(repo, ignore_errors=True)  # nothing of the repository is left but its refs
