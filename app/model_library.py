"""The models the picker offers: the bundled models, every `.gguf` file in the user's models
folder, and every file added before (kept in the store). What each one is and needs comes
from its header (`engine.model_info`). Nothing here imports Qt.
"""

from dataclasses import dataclass
from pathlib import Path

from engine.bundled import bundled_models


@dataclass(frozen=True)
class LibraryEntry:
    """A model file the library lists, before its header has been read."""

    path: Path
    name: str
    bundled: bool = False


def library_entries(models_folder: Path, added: list[tuple[str, str]]) -> list[LibraryEntry]:
    """Bundled models, then `.gguf` files in `models_folder`, then added files `(path, name)`.

    Each path appears once. Added files that no longer exist are still listed, so the
    picker can say they moved.
    """
    entries: list[LibraryEntry] = []
    seen: set[Path] = set()

    def add(entry: LibraryEntry) -> None:
        key = entry.path.resolve() if entry.path.exists() else entry.path
        if key not in seen:
            seen.add(key)
            entries.append(entry)

    for model in bundled_models():
        add(LibraryEntry(model.path, model.name, bundled=True))
    if models_folder.is_dir():
        for path in sorted(models_folder.glob("*.gguf")):
            add(LibraryEntry(path, path.stem))
    for added_path, name in added:
        add(LibraryEntry(Path(added_path), name))
    return entries
