"""Opening a model: the one call the app, the server and the CLI make (`open_model`).

`open_model(source, settings)` opens a local GGUF file (a path, a `file://` URI or a
bundled model's key) or names a model on a remote OpenAI-compatible server (a
`RemoteModel`, or an ``openai+http(s)://…/v1#model`` URI), and returns an `OpenedModel`:
what a chat session, the server and the CLI all use. For a local file, in order:

1. validate: the header is read (ModelFileError, UnsupportedModelError say what is wrong);
2. plan memory (`MemoryCheck`, by the memory rule of the backend that will run it): a model
   that cannot run at all raises OutOfMemory before anything is loaded; one that fits only
   once the caller's current model is gone has the caller make room first (`make_room`);
3. load on the chosen backend, with the reasons the others were passed over;
4. pick the chat template: the model's own override (`OpenSettings.template`), else the
   file's, else the built-in format of its family;
5. apply LoRA adapters, load and check the draft model, and pick the speculation mode.

What the user should hear about (a slow fit, tensors converted at load, a guessed template,
a draft model refused, drafting that does not pay) is collected in `OpenedModel.notes`, and
given to `on_note` as it arises. A failure at any step closes what was opened: nothing is
left half-open. Qt-free: the app maps its settings and each model's own onto `OpenSettings`.
"""

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from backends.kv_types import DEFAULT_KV_TYPE
from backends.selection import planned_backend
from engine.bundled import resolve_model_path
from engine.chat_session import ChatSession
from engine.chat_template import ChatTemplate
from engine.errors import OutOfMemory, RemoteError, SprigError
from engine.gguf_file import open_gguf
from engine.loader import DEFAULT_CONTEXT, LoadedModel, ProgressCallback, load_model
from engine.model_info import ModelInfo, available_memory, describe_model
from engine.model_uri import REMOTE_PREFIX, local_uri, parse_model_uri, remote_uri
from engine.models.common import Transformer
from engine.models.lora import read_adapter
from engine.remote.endpoints import Endpoint, normalize_base_url
from engine.sampling import SamplingParams
from engine.speculation import Speculation, check_draft
from engine.tokenizer import Tokenizer

if TYPE_CHECKING:
    from engine.remote.client import RemoteChat


@dataclass(frozen=True)
class OpenSettings:
    """How to open a model. Qt-free: the app maps its settings and the model's own onto these.

    `context_length` None: `DEFAULT_CONTEXT`, capped at the model's own. `template`: Jinja
    source in place of the file's chat template. `speculative`: "off", "auto", "ngram" or
    "draft" (`engine.speculation.MODES`); the draft model (`draft_model`) is loaded for
    "auto" and "draft". `draft_optional`: a draft model that cannot be loaded or cannot draft
    is a note and the model answers without it ("draft" becomes "auto"), where otherwise it
    is an error. `adapters`: LoRA adapter files and their scales. `name`: what to call the
    model (default: the file's general.name, else its stem). `api_key`: a remote server's.
    """

    backend: str = "auto"
    threads: int | None = None
    context_length: int | None = None
    kv_type: str = DEFAULT_KV_TYPE
    template: str | None = None
    speculative: str = "auto"
    draft_model: str | Path | None = None
    draft_tokens: int | None = None
    draft_optional: bool = False
    adapters: tuple[tuple[str | Path, float], ...] = ()
    name: str | None = None
    api_key: str | None = None


@dataclass(frozen=True)
class RemoteModel:
    """Model `model_id` on a remote OpenAI-compatible server."""

    endpoint: Endpoint
    model_id: str


@dataclass(frozen=True)
class MemoryCheck:
    """The memory verdict of a load: what it needs on `backend` of what is `available` (free now plus
    what the caller's current model gives back), whether it `fits` (else it runs, slowly or tightly),
    and whether the current model can stay while it loads (`keep_current`). `verdict` says it in words."""

    backend: str
    needed: int
    available: int
    fits: bool
    keep_current: bool
    verdict: str


@dataclass
class OpenedModel:
    """An opened model: a loaded local file (`loaded`, with its draft model and speculation) or a remote
    one (`remote`). `notes` are what the user should hear about the opening, in the order they arose."""

    name: str
    uri: str
    loaded: LoadedModel | None = None
    info: ModelInfo | None = None
    memory: MemoryCheck | None = None
    draft: LoadedModel | None = None
    speculation: Speculation | None = None
    remote: "RemoteChat | None" = None
    notes: list[str] = field(default_factory=list)

    @property
    def local(self) -> LoadedModel:
        """The loaded model file; RemoteError for a remote model, which has none here."""
        if self.loaded is None:
            raise RemoteError(f"{self.name} runs on a server: it has no model file loaded here.")
        return self.loaded

    @property
    def tokenizer(self) -> Tokenizer:
        """The loaded file's tokenizer."""
        return self.local.tokenizer

    @property
    def template(self) -> ChatTemplate:
        """The chat template in use (the override, the file's, or the built-in format)."""
        return self.local.template

    @property
    def backend_name(self) -> str:
        """The backend the model runs on ("remote" for a server's model)."""
        return self.loaded.backend.name if self.loaded is not None else "remote"

    @property
    def backend_reasons(self) -> list[str]:
        """Why each other backend was passed over."""
        return list(self.loaded.backend_notes) if self.loaded is not None else []

    def new_session(
        self,
        n_ctx: int | None = None,
        max_tokens: int = 512,
        system_prompt: str | None = None,
        params: SamplingParams = SamplingParams(),
        speculative: str | None = None,
    ) -> ChatSession:
        """A chat session on the loaded model, drafting as `speculative` says (default: the mode it was
        opened with; "draft" without a draft model drafts as "auto"). Each session gets its own
        speculation state; c(T) is measured once per model."""
        mode = speculative or (self.speculation.mode if self.speculation else "off")
        draft_tokens = self.speculation.draft_tokens if self.speculation else None
        speculation = speculation_for(
            "auto" if mode == "draft" and self.draft is None else mode, self.local.model, self.draft, draft_tokens
        )
        return ChatSession(
            self.local,
            system_prompt=system_prompt,
            n_ctx=n_ctx,
            params=params,
            max_tokens=max_tokens,
            speculation=speculation,
        )

    def close(self) -> None:
        """Release the model, its draft model, or the remote client's connections."""
        for loaded in (self.draft, self.loaded):
            if loaded is not None:
                loaded.close()
        self.draft = self.loaded = None
        if self.remote is not None:
            self.remote.close()
            self.remote = None


def open_model(
    source: str | Path | RemoteModel,
    settings: OpenSettings = OpenSettings(),
    *,
    progress: ProgressCallback | None = None,
    cancel: threading.Event | None = None,
    on_note: Callable[[str], None] | None = None,
    reclaimable: int = 0,
    make_room: Callable[[ModelInfo], None] | None = None,
) -> OpenedModel:
    """Open `source` with `settings` (see the module's docstring for the steps).

    `progress(fraction, stage)` follows the load and setting `cancel` stops it (LoadCancelled);
    `on_note(text)` hears each note as it arises. `reclaimable` is the memory the caller's current
    model gives back when `make_room(info)` releases it; the caller's model stays while the new one
    loads where both fit. Raises ModelFileError, OutOfMemory, BackendFailure, TemplateError,
    DraftModelError, RemoteError (a source that is no model), ValueError (a bad setting).
    """
    remote = _remote_source(source)
    if remote is not None:
        from engine.remote.client import RemoteChat  # imports openai only for a remote model

        chat = RemoteChat(remote.endpoint, remote.model_id, settings.api_key)
        return OpenedModel(remote.model_id, remote_uri(remote.endpoint.base_url, remote.model_id), remote=chat)
    assert not isinstance(source, RemoteModel)  # a remote source returned above
    notes: list[str] = []

    def note(text: str) -> None:
        notes.append(text)
        if on_note is not None:
            on_note(text)

    model_file = open_gguf(_local_path(source))
    try:
        info = describe_model(model_file, settings.name)
        memory = check_memory(info, settings, available_memory(), reclaimable)
    except BaseException:
        model_file.close()
        raise
    if not memory.fits:
        note(f"{info.name} {memory.verdict}.")
    if not memory.keep_current and make_room is not None:
        make_room(info)
    loaded = load_model(
        model_file, settings.backend, progress, cancel, threads=settings.threads, kv_type=settings.kv_type
    )
    opened = OpenedModel(info.name, local_uri(loaded.path), loaded, info, memory, notes=notes)
    try:
        if loaded.load_notes:
            note(load_notes_text(info.name, loaded.load_notes))
        for path, scale in settings.adapters:
            adapter = read_adapter(resolve_model_path(str(path)))
            loaded.model.adapters.push(adapter, scale)
            note(f"LoRA adapter {adapter.name} at scale {scale:g}")
        if settings.template is not None:
            loaded.template = template_override(loaded.template, settings.template, info.name)
        template_notice = loaded.template.notice(info.name)
        if template_notice:
            note(template_notice)
        opened.draft = _draft_for(loaded, info.name, settings, note)
        mode = settings.speculative
        if mode == "draft" and opened.draft is None and settings.draft_model is not None:
            mode = "auto"  # the draft model was refused, and said so
        opened.speculation = speculation_for(mode, loaded.model, opened.draft, settings.draft_tokens)
        if opened.speculation.off_because:
            note(f"{info.name}: {opened.speculation.off_because}.")
    except BaseException:
        opened.close()
        raise
    return opened


def check_memory(info: ModelInfo, settings: OpenSettings, free: int, reclaimable: int = 0) -> MemoryCheck:
    """The memory verdict of loading `info` with `settings` when `free` bytes are free now and the
    caller's current model would give back `reclaimable`. Raises OutOfMemory when the file's pages
    and the KV cache do not fit even then (it cannot run at all)."""
    backend, kv_type = planned_backend(settings.backend), settings.kv_type
    n_ctx = settings.context_length or DEFAULT_CONTEXT
    available = free + reclaimable
    fits, verdict = info.memory_verdict(n_ctx, available, backend, kv_type)
    if not info.can_run(n_ctx, available, kv_type):
        raise OutOfMemory(f"{info.name} {verdict}.")
    keep_current = info.memory_verdict(n_ctx, free, backend, kv_type)[0]
    return MemoryCheck(backend, info.memory_needed(n_ctx, backend, kv_type), available, fits, keep_current, verdict)


def speculation_for(
    mode: str, model: Transformer, draft: LoadedModel | None = None, draft_tokens: int | None = None
) -> Speculation:
    """The speculation of `mode` for `model` (drafting with `draft`, `draft_tokens` at a time where fixed),
    its costs c(T) measured now, at load, not in the first answer; `off_because` says where drafting is
    off for the model although the mode asks for it. ValueError for "draft" without a draft model."""
    speculation = Speculation(mode, draft_tokens, draft)
    if speculation.enabled:
        speculation.prepare(model)
    return speculation


def template_override(current: ChatTemplate, source: str, model_name: str) -> ChatTemplate:
    """`current` (the file's template) replaced by `source`, with the file's BOS and EOS texts.

    Raises TemplateError when `source` is not valid Jinja."""
    return ChatTemplate(
        source, bos_token=current.bos_token, eos_token=current.eos_token, origin=f"the template set for {model_name}"
    )


def load_notes_text(model_name: str, notes: list[str]) -> str:
    """What the backend changed at load, as one headline line and one line per note below it."""
    if len(notes) == 1:
        return f"{model_name}: {notes[0]}."
    headline = f"{model_name}: {len(notes)} tensors were converted at load, so loading takes longer."
    return "\n".join([headline, *(f"• {note}" for note in notes)])


def _remote_source(source: str | Path | RemoteModel) -> RemoteModel | None:
    """The remote model `source` names, or None for a local file; RemoteError for a malformed remote URI."""
    if isinstance(source, RemoteModel):
        return source
    if not isinstance(source, str) or not source.startswith(REMOTE_PREFIX):
        return None
    try:
        ref = parse_model_uri(source)
    except ValueError as exc:
        raise RemoteError(
            f"{source} is not a model on a server: write it as openai+http(s)://host:port/v1#model."
        ) from exc
    assert ref.base_url is not None and ref.model_id is not None  # a remote URI names both
    base_url = normalize_base_url(ref.base_url)
    return RemoteModel(Endpoint(base_url, base_url), ref.model_id)


def _local_path(source: str | Path) -> Path:
    """The file a local source names: a path, a `file://` URI, or a bundled model's key."""
    if isinstance(source, str) and source.startswith("file:"):
        path = parse_model_uri(source).path
        assert path is not None  # a file URI names a path
        return path
    return resolve_model_path(str(source))


def _draft_for(
    loaded: LoadedModel, name: str, settings: OpenSettings, note: Callable[[str], None]
) -> LoadedModel | None:
    """The draft model set for `loaded`, loaded on the same backend and checked, or None (none set, or a
    mode that does not draft with one). With `settings.draft_optional` one that cannot draft is a note."""
    if settings.draft_model is None or settings.speculative not in ("auto", "draft"):
        return None
    try:
        draft = load_model(
            resolve_model_path(str(settings.draft_model)),
            settings.backend,
            threads=settings.threads,
            kv_type=settings.kv_type,
        )
        try:
            check_draft(loaded, draft)
        except BaseException:
            draft.close()
            raise
    except SprigError as exc:
        if not settings.draft_optional:
            raise
        note(f"{name} answers without its draft model: {exc}")
        return None
    return draft
