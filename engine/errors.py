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


class DraftModelError(SprigError):
    """A model cannot draft for the loaded one (speculative decoding); the message says why."""
