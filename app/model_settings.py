"""Per-model settings: what one model file uses in place of the app's settings.

Qt-free. A `ModelSettings` is kept per model file in the store (`Store.model_settings`),
keyed by the file's path; with the path go the file's name and size, so that a file moved
or renamed inside its folder finds its settings again when it is next opened (see
`Store.model_settings`). Every field is optional: None follows the app's setting.

What overrides what, for one answer: the app's settings, then the model's, then the
conversation's (Chat → Chat settings), so a conversation's own system prompt wins over
the model's. `with_model_settings` applies the model's layer.

- `context_length`, `cpu_threads`, `system_prompt`, `speculative`: as in the app's settings,
  plus the speculative mode "draft" (always draft with the draft model).
- `template`: Jinja source that replaces the file's chat template (a built-in format or
  one pasted); `check_template` renders it in the engine's sandbox before it is kept.
- `draft_model`: the path of a model file that drafts for this one.
- `kv_type`: what the KV cache stores keys and values as ("f16", "q8_0", "f32":
  `backends.kv_types`); None: float16.
"""

import json
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

from app.settings import RANGES, Settings
from backends.kv_types import DEFAULT_KV_TYPE, KV_TYPES
from engine.chat_template import ChatTemplate
from engine.errors import TemplateError
from engine.opening import OpenSettings

MODEL_SPECULATIVE = ("auto", "ngram", "draft", "off")  # "draft": the draft model drafts every round
KV_TYPE_CHOICES = (
    ("Float16 (default)", None),
    ("8-bit, Q8_0 (about half of float16's memory)", "q8_0"),
    ("Float32 (for checks: twice float16's memory)", "f32"),
)
CHECK_CONVERSATION = [
    {"role": "system", "content": "You are helpful."},
    {"role": "user", "content": "Hello!"},
    {"role": "assistant", "content": "Hi. How can I help?"},
    {"role": "user", "content": "Tell me a joke."},
]


@dataclass(frozen=True)
class ModelSettings:
    """One model file's settings; None in a field follows the app's setting."""

    context_length: int | None = None
    cpu_threads: int | None = None
    template: str | None = None
    system_prompt: str | None = None
    speculative: str | None = None
    draft_model: str | None = None
    kv_type: str | None = None

    @property
    def empty(self) -> bool:
        """Whether every field follows the app's settings."""
        return self == ModelSettings()

    def to_json(self) -> str:
        """The fields that are set, as a JSON object."""
        return json.dumps({k: v for k, v in asdict(self).items() if v is not None}, ensure_ascii=False)

    @classmethod
    def from_json(cls, text: str) -> "ModelSettings":
        """Settings from `to_json`'s text; unknown keys, values of the wrong type and numbers
        out of range are left out (they follow the app's settings)."""
        try:
            data = json.loads(text)
        except json.JSONDecodeError:
            return cls()
        if not isinstance(data, dict):
            return cls()
        kept = {}
        for f in fields(cls):
            value = data.get(f.name)
            if f.name in RANGES:
                low, high = RANGES[f.name]
                ok = isinstance(value, int) and not isinstance(value, bool) and low <= value <= high
            elif f.name == "speculative":
                ok = value in MODEL_SPECULATIVE
            elif f.name == "kv_type":
                ok = value in KV_TYPES
            else:
                ok = isinstance(value, str)
            if ok:
                kept[f.name] = value
        return cls(**kept)


def with_model_settings(settings: Settings, model: ModelSettings, has_draft: bool = False) -> Settings:
    """`settings` with a model's settings over them.

    The mode "draft" needs a loaded draft model (`has_draft`); without one it falls back
    to "auto" (the loading said why).
    """
    changes = {
        name: getattr(model, name)
        for name in ("context_length", "cpu_threads", "system_prompt", "speculative")
        if getattr(model, name) is not None
    }
    if changes.get("speculative") == "draft" and not has_draft:
        changes["speculative"] = "auto"
    return replace(settings, **changes)


def open_settings(settings: Settings, model: ModelSettings, name: str | None = None) -> OpenSettings:
    """How the engine opens a model (`engine.opening.open_model`) for the app's `settings` with the
    model's own (`with_model_settings` applied already) over them; `name` is the library's name for it.
    A draft model that cannot draft is a notice, not a failed load."""
    return OpenSettings(
        backend=settings.backend,
        threads=settings.cpu_threads or None,
        context_length=settings.context_length,
        kv_type=model.kv_type or DEFAULT_KV_TYPE,
        template=model.template,
        speculative=settings.speculative,
        draft_model=model.draft_model,
        draft_optional=True,
        name=name,
    )


def check_template(source: str, bos_token: str = "", eos_token: str = "") -> str | None:
    """Why the Jinja `source` cannot be a chat template (the sandbox's own message), or None when
    it compiles and renders a short conversation with a system prompt."""
    try:
        template = ChatTemplate(source, bos_token=bos_token, eos_token=eos_token)
        if not template.render(CHECK_CONVERSATION).strip():
            return "The template writes nothing for a conversation; the model would see an empty prompt."
    except TemplateError as exc:
        return str(exc)
    return None


def file_fingerprint(path: Path) -> tuple[str, int] | None:
    """The file's name and size, by which its settings are found after a move; None if it is missing."""
    try:
        return path.name, path.stat().st_size
    except OSError:
        return None
