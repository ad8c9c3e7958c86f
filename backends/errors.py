"""Errors raised by the backends. The engine wraps them into its own hierarchy."""


class BackendError(Exception):
    """A backend could not do what was asked."""


class BackendUnavailable(BackendError):
    """The backend asked for cannot run on this machine; the message says why."""


class UnsupportedTensorType(BackendError):
    """A GGML tensor type that Sprig cannot dequantize; the message names it."""


class TensorDataError(BackendError):
    """A tensor's bytes do not match its type and shape (truncated or mis-sized data)."""
