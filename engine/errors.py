"""The one exception hierarchy of the engine.

Every message says what is wrong, with which file, and what the user can do. The GUI
shows these messages as they are, so they are written for people, not for logs.
"""


class SprigError(Exception):
    """Base class of every error the engine raises on purpose."""


class ModelFileError(SprigError):
    """A model file is missing, unreadable, corrupt, truncated or hostile."""


class UnsupportedModelError(ModelFileError):
    """A well-formed model file whose architecture or tensor type Sprig cannot run."""


class TokenizerError(SprigError):
    """The vocabulary in a model file cannot be turned into a tokenizer."""


class TemplateError(SprigError):
    """A chat template failed to render, or tried something the sandbox forbids."""


class ContextFullError(SprigError):
    """The tokens to process do not fit in the context window that is left."""


class LoadCancelled(SprigError):
    """The user cancelled loading a model; nothing was kept."""


class BackendFailure(SprigError):
    """A compute backend is unavailable or failed; the message says which and why."""


class OutOfMemory(SprigError):
    """A model would not fit in the memory available, even with the current model released."""


class DraftModelError(SprigError):
    """A model cannot draft for the loaded one (speculative decoding); the message says why."""


class HubError(SprigError):
    """Searching, listing or downloading from the Hugging Face Hub failed; the message says why and what to do."""


class HubOfflineError(HubError):
    """The Hub cannot be reached: no network, or offline mode is on. Cached models still work."""


class HubAccessError(HubError):
    """A gated or private repository (401/403): its licence must be accepted and a token added."""


class DownloadIntegrityError(HubError):
    """A download was truncated or its SHA-256 differs from the Hub's record; the file was removed."""


class DiskSpaceError(HubError):
    """Not enough free disk space for a download; nothing was left half-written."""


class DownloadPaused(HubError):
    """A download was paused or cancelled by the user; a paused one resumes where it stopped."""


class RemoteError(SprigError):
    """A remote OpenAI-compatible server failed, refused or could not be reached; the message says which and why.

    `retry_after` is the wait in seconds the server asked for (429/503 with Retry-After), when it gave one.
    """

    def __init__(self, message: str, retry_after: float | None = None):
        super().__init__(message)
        self.retry_after = retry_after
