"""The app's settings: what they are, where they live, and how bad values are handled.

Qt-free on purpose, so the rules can be tested without a display.

- Defaults come from `resources/default_settings.json`. A `null` models folder there
  means the platform's data folder (`default_models_folder()`).
- The user's file is `settings.json` in the platform's config folder. `load_settings`
  never fails: a missing file gives the defaults; an unreadable or corrupt file, or a
  field of the wrong type, gives the default for what is bad plus a warning (a sentence
  for people) that the UI can show. Numbers out of range are clamped, with a warning.
- `save_settings` writes atomically (temp file + `os.replace`), so a crash mid-save
  leaves the old file whole.
- A conversation can override the sampling fields (`SAMPLING_FIELDS`);
  `effective_sampling` merges such overrides over the global settings.
"""

import json
import math
import os
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, fields, replace
from functools import cache
from pathlib import Path
from typing import Any

from platformdirs import user_config_path, user_data_path

from backends.selection import PREFERENCES as BACKENDS
from engine.sampling import SamplingParams

APP_NAME = "Sprig"

# Stylesheets and default settings. From a checkout this is the repository's
# resources/ folder; an installed wheel puts it next to the `app` package as well
# (pyproject: package-data app = ["../resources/*"]), so the same lookup serves both.
RESOURCES = Path(__file__).resolve().parent.parent / "resources"
DEFAULTS_FILE = RESOURCES / "default_settings.json"

THEMES = ("system", "light", "dark")  # "system" follows the desktop's light or dark scheme
SPECULATIVE = ("auto", "ngram", "off")  # the speculative decoding modes the app offers (no draft model yet)
SAMPLING_FIELDS = ("temperature", "top_k", "top_p", "min_p", "repeat_penalty", "max_tokens", "seed")
CONVERSATION_FIELDS = ("system_prompt", *SAMPLING_FIELDS)  # what one conversation may set for itself

# Inclusive (low, high) limits of every numeric field; the settings UI uses them too.
# repeat_penalty below 1 would reward repetition, so 1 (off) is its floor.
RANGES: dict[str, tuple[float, float]] = {
    "temperature": (0.0, 5.0),
    "top_k": (0, 100_000),
    "top_p": (0.0, 1.0),
    "min_p": (0.0, 1.0),
    "repeat_penalty": (1.0, 2.0),
    "max_tokens": (1, 32_768),
    "seed": (0, 2**31 - 1),
    "context_length": (256, 131_072),
    "cpu_threads": (0, 256),
    "text_scale": (70, 200),
    "server_port": (1, 65_535),
    "saved_states_mb": (0, 1_048_576),
}


@dataclass
class Settings:
    """Every user setting. Build the defaults with `Settings.defaults()`.

    `seed` None draws a fresh random seed for each answer. `text_scale` is the text size
    in percent of the system's. `cpu_threads` 0 gives the cpu backend one thread per
    physical core. `speculative` is the speculative decoding mode ("auto" drafts only
    where it pays). `hub_offline` keeps Sprig off the Hugging Face Hub (Get models then
    lists only what is downloaded). `last_model` is the path of the model file opened last, or None;
    `last_conversation` the id of the chat open last, or None. The local server listens on
    `server_port`, lets web pages from `server_origins` (space or comma separated) call it, and
    with `server_network` binds every interface (only with an API key, kept in the keyring,
    never here). Conversations that are left keep their KV cache on disk up to `saved_states_mb`
    in all (0: none kept), so that reopening one does not read it again. `window_geometry` is the
    window's size, place and maximised state at closing (Qt's saveGeometry, base64), or None.
    """

    system_prompt: str
    temperature: float
    top_k: int
    top_p: float
    min_p: float
    repeat_penalty: float
    max_tokens: int
    seed: int | None
    context_length: int
    backend: str
    cpu_threads: int
    speculative: str
    models_folder: Path
    theme: str
    text_scale: int
    last_model: str | None
    last_conversation: int | None
    hub_offline: bool
    server_port: int
    server_origins: str
    server_network: bool
    saved_states_mb: int = 2048
    window_geometry: str | None = None

    @classmethod
    def defaults(cls) -> "Settings":
        """The settings of a fresh install, from resources/default_settings.json."""
        return replace(_defaults())

    def to_dict(self) -> dict:
        """Plain JSON-ready values (the models folder as a string)."""
        data = asdict(self)
        data["models_folder"] = str(self.models_folder)
        return data


def default_settings_path() -> Path:
    """Where the user's settings live: <config folder>/Sprig/settings.json."""
    return user_config_path(APP_NAME, appauthor=False) / "settings.json"


def default_models_folder() -> Path:
    """Where model files go unless the user picks a folder: <data folder>/Sprig/models."""
    return user_data_path(APP_NAME, appauthor=False) / "models"


class _Invalid(ValueError):
    """A value of the wrong type or an unknown choice; the message says which."""


def _number(kind: type) -> Callable[[str, object], float | int]:
    """A parser accepting JSON numbers of `kind` (int also accepts 3.0, never True)."""
    noun = "a whole number" if kind is int else "a number"

    def parse(name: str, value: Any) -> float | int:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        if not ok or (kind is int and not float(value).is_integer()):
            raise _Invalid(f"{name} must be {noun}, not {value!r}")
        return kind(value)

    return parse


def _text(name: str, value: object) -> str:
    if not isinstance(value, str):
        raise _Invalid(f"{name} must be text, not {value!r}")
    return value


def _choice(options: tuple[str, ...]) -> Callable[[str, object], str]:
    def parse(name: str, value: object) -> str:
        if value not in options:
            raise _Invalid(f"{name} must be one of {', '.join(options)}, not {value!r}")
        return value

    return parse


def _flag(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise _Invalid(f"{name} must be true or false, not {value!r}")
    return value


def _optional(parse: Callable[[str, object], object]) -> Callable[[str, object], object]:
    return lambda name, value: None if value is None else parse(name, value)


def _folder(name: str, value: object) -> Path:
    if value is None:
        return default_models_folder()
    if not isinstance(value, str) or not value.strip():
        raise _Invalid(f"{name} must be a folder path, not {value!r}")
    return Path(value).expanduser()


_PARSERS: dict[str, Callable[[str, object], object]] = {
    "system_prompt": _text,
    "temperature": _number(float),
    "top_k": _number(int),
    "top_p": _number(float),
    "min_p": _number(float),
    "repeat_penalty": _number(float),
    "max_tokens": _number(int),
    "seed": _optional(_number(int)),
    "context_length": _number(int),
    "backend": _choice(BACKENDS),
    "cpu_threads": _number(int),
    "speculative": _choice(SPECULATIVE),
    "models_folder": _folder,
    "theme": _choice(THEMES),
    "text_scale": _number(int),
    "last_model": _optional(_text),
    "last_conversation": _optional(_number(int)),
    "hub_offline": _flag,
    "server_port": _number(int),
    "server_origins": _text,
    "server_network": _flag,
    "saved_states_mb": _number(int),
    "window_geometry": _optional(_text),
}


def _coerce(name: str, value: object) -> tuple[Any, str | None]:
    """The value fit for field `name`, clamped into range, and a note if it was clamped.

    Raises _Invalid for a wrong type or an unknown choice.
    """
    parsed: Any = _PARSERS[name](name, value)
    if name in RANGES and parsed is not None:
        low, high = RANGES[name]
        clamped = type(parsed)(min(max(parsed, low), high))
        if clamped != parsed:
            return clamped, f"{name} {parsed} is outside {low}–{high}; using {clamped}"
    return parsed, None


def merge_settings(base: Settings, data: Mapping[str, object]) -> tuple[Settings, list[str]]:
    """`base` with the fields of `data` validated over it, and a warning per bad field.

    Unknown keys are ignored (a newer version's file still loads). A field of the wrong
    type keeps its value from `base`; a number out of range is clamped.
    """
    known = {f.name for f in fields(Settings)}
    changes: dict[str, Any] = {}
    warnings: list[str] = []
    for name, raw in data.items():
        if name not in known:
            continue
        try:
            changes[name], note = _coerce(name, raw)
        except _Invalid as exc:
            kept = getattr(base, name)
            warnings.append(f"{exc}; using {str(kept) if isinstance(kept, Path) else repr(kept)}")
            continue
        if note:
            warnings.append(note)
    return replace(base, **changes), warnings


@cache
def _defaults() -> Settings:
    """Parse the bundled defaults once. A bad defaults file is a packaging bug, so it raises."""
    data = json.loads(DEFAULTS_FILE.read_text(encoding="utf-8"))
    values = {f.name: _coerce(f.name, data[f.name])[0] for f in fields(Settings)}
    return Settings(**values)


def load_settings(path: Path | None = None) -> tuple[Settings, list[str]]:
    """Read the settings at `path` (default: `default_settings_path()`).

    Returns (settings, warnings). It never raises for a bad file: a missing file gives
    the defaults and no warnings; an unreadable or corrupt file gives the defaults and
    one warning; bad fields fall back to their defaults, one warning each. Every
    warning names the file, so the UI can show them as they are.
    """
    path = default_settings_path() if path is None else path
    defaults = Settings.defaults()
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return defaults, []
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        return defaults, [f"Settings file {path} could not be read ({exc}); using the defaults."]
    if not isinstance(data, dict):
        return defaults, [f"Settings file {path} does not hold a JSON object; using the defaults."]
    settings, warnings = merge_settings(defaults, data)
    return settings, [f"Settings file {path}: {w}." for w in warnings]


def save_settings(settings: Settings, path: Path | None = None) -> None:
    """Write `settings` as JSON to `path` (default: `default_settings_path()`), atomically.

    The text goes to a temporary file in the same folder, which then replaces the old
    file in one step. Raises OSError if the folder cannot be written.
    """
    path = default_settings_path() if path is None else path
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(settings.to_dict(), f, indent=2, ensure_ascii=False)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise


def effective_sampling(settings: Settings, overrides: Mapping[str, object]) -> Settings:
    """`settings` with a conversation's overrides (its system prompt, its sampling) applied.

    Only keys in CONVERSATION_FIELDS count; others are ignored. A value of the wrong type
    is ignored (the global value stays); one out of range is clamped. `"seed": None`
    is a valid override: a random seed for each answer.
    """
    sampling = {k: v for k, v in overrides.items() if k in CONVERSATION_FIELDS}
    return merge_settings(settings, sampling)[0]


def sampling_params(settings: Settings) -> SamplingParams:
    """The engine's sampler settings for `settings` (max_tokens is a generation limit, not here)."""
    return SamplingParams(
        temperature=settings.temperature,
        top_k=settings.top_k,
        top_p=settings.top_p,
        min_p=settings.min_p,
        repeat_penalty=settings.repeat_penalty,
        seed=settings.seed,
    )
