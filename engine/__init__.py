"""Sprig's inference engine: model files, tokenizer, chat templates and generation.

This package never imports Qt.
"""

OPENING = ("open_model", "OpenSettings", "OpenedModel", "RemoteModel")


def __getattr__(name: str):
    """`engine.open_model` and its types, imported from `engine.opening` when first asked for
    (so that importing a small engine module does not import the whole engine)."""
    if name in OPENING:
        from engine import opening

        return getattr(opening, name)
    raise AttributeError(f"module 'engine' has no attribute {name!r}")
