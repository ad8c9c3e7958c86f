"""LoRA adapters in the app: the adapter files of the models folder, listed under the models
they fit, and the ones each conversation uses.

Adapters are the GGUF files llama.cpp's `convert_lora_to_gguf.py` writes, kept in the
`adapters` folder inside the models folder (apart from the models, so the model library
never offers one as a model). An adapter is listed under a model of its architecture, and
where both files name their base model, of the same one; the engine checks every matrix's
shape when it applies one, and refuses a misfit with a message the app shows as it is.

A conversation keeps its adapters in its overrides (`"adapters": [{"path", "scale"}]`), and
each answer runs with them (`engine.chat_engine.LocalChatEngine.adapters`). Nothing here
imports Qt.
"""

import re
from dataclasses import dataclass
from pathlib import Path

from engine.errors import SprigError
from engine.gguf_file import open_gguf

ADAPTERS_FOLDER = "adapters"
KEY = "adapters"  # in a conversation's overrides
SCALE_RANGE = (-4.0, 4.0)


@dataclass(frozen=True)
class AdapterFile:
    """One adapter file, as its header describes it."""

    path: Path
    name: str
    architecture: str
    base_model: str | None  # the base model the adapter was made for, where the file names it


def read_adapter_file(path: Path) -> AdapterFile | None:
    """The header of `path` if it is a LoRA adapter, else None."""
    try:
        with open_gguf(path) as f:
            meta = f.metadata
            if meta.get("general.type") != "adapter" or meta.get("adapter.type") != "lora":
                return None
            base = meta.get("general.base_model.0.name")
            return AdapterFile(path, path.stem, str(meta.get("general.architecture")), base and str(base))
    except (OSError, ValueError, SprigError):
        return None


def find_adapters(models_folder: Path) -> list[AdapterFile]:
    """The LoRA adapters in `models_folder`/adapters, by name."""
    folder = models_folder / ADAPTERS_FOLDER
    found = (read_adapter_file(path) for path in sorted(folder.glob("*.gguf"))) if folder.is_dir() else ()
    return [adapter for adapter in found if adapter is not None]


def _plain(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


def adapters_for(architecture: str, model_names: list[str], adapters: list[AdapterFile]) -> list[AdapterFile]:
    """The adapters listed under a model of `architecture` named `model_names` (its
    general.name, basename, file name): its architecture's, but not those made for a base
    model of another name."""
    names = {_plain(n) for n in model_names if n}
    return [
        a
        for a in adapters
        if a.architecture == architecture and (not a.base_model or not names or _plain(a.base_model) in names)
    ]


def conversation_adapters(overrides: dict) -> list[tuple[str, float]]:
    """The (file, scale) pairs a conversation's overrides hold, in order; malformed entries
    are dropped and scales clamped to SCALE_RANGE."""
    entries = overrides.get(KEY)
    if not isinstance(entries, list):
        return []
    low, high = SCALE_RANGE
    out = []
    for entry in entries:
        if (
            isinstance(entry, dict)
            and isinstance(entry.get("path"), str)
            and isinstance(entry.get("scale"), (int, float))
            and not isinstance(entry.get("scale"), bool)
        ):
            out.append((entry["path"], min(max(float(entry["scale"]), low), high)))
    return out


def with_adapters(overrides: dict, adapters: list[tuple[str, float]]) -> dict:
    """`overrides` with its adapters replaced by `adapters` (file, scale)."""
    rest = {k: v for k, v in overrides.items() if k != KEY}
    return {**rest, KEY: [{"path": path, "scale": scale} for path, scale in adapters]} if adapters else rest
