"""Export a chat to Markdown or JSON, and import one back from JSON, Qt-free.

Imports come from files anyone can write, so `import_json` checks every field before it
writes anything, and then writes the whole chat in one transaction.
"""

import json
from pathlib import Path

from app.metrics_text import metrics_summary
from app.storage import ROLES, Conversation, Message, MessageState, Store
from engine.errors import SprigError

FORMAT = "sprig-conversation"
VERSION = 1
MAX_FILE_BYTES = 64 * 1024 * 1024
MAX_MESSAGES = 100_000
MAX_CONTENT_CHARS = 4_000_000
MAX_TITLE_CHARS = 1_000
MAX_OBJECT_CHARS = 65_536  # overrides or metrics, as JSON
MAX_TIMESTAMP = 1e11  # seconds since 1970: the year 5138
IMPORTABLE_STATES = tuple(state for state in MessageState if state != MessageState.STREAMING)


class TranscriptError(SprigError, ValueError):
    """A conversation file is unreadable or not a valid Sprig conversation."""


def to_markdown(conversation: Conversation, messages: list[Message]) -> str:
    """The chat as Markdown: a heading per message, contents verbatim, metrics in italics."""
    parts = [f"# {conversation.title}"]
    for message in messages:
        heading = message.role.capitalize()
        if message.role == "assistant" and message.model:
            heading += f" ({message.model})"
        if message.versions:
            heading += f", version {message.active + 1} of {len(message.versions) + 1}"
        parts += [f"## {heading}", message.content]
        footnote = _footnote(message)
        if footnote:
            parts.append(f"*{footnote}*")
    return "\n\n".join(parts) + "\n"


def _footnote(message: Message) -> str:
    """'42 tokens · 31.5 tok/s · TTFT 0.12 s', plus the state of an unfinished answer."""
    state = "" if message.state == MessageState.COMPLETE else message.state
    return metrics_summary(message.metrics, state) or state


def to_json(conversation: Conversation, messages: list[Message]) -> dict:
    """The chat as a JSON-ready dict that `import_json` reads back."""
    return {
        "format": FORMAT,
        "version": VERSION,
        "title": conversation.title,
        "created_at": conversation.created_at,
        "overrides": conversation.overrides,
        "messages": [
            {
                "role": message.role,
                "content": message.content,
                "model": message.model,
                "metrics": message.metrics,
                "state": message.state,
                "created_at": message.created_at,
                "versions": list(message.versions),
                "active": message.active,
            }
            for message in messages
        ],
    }


def read_json_file(path: Path | str) -> dict:
    """The JSON object in the file at `path`; TranscriptError naming the file if it is
    unreadable, too big, not JSON, or not a JSON object."""
    try:
        with open(path, "rb") as file:
            raw = file.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise TranscriptError(f"Cannot read {path}: {exc.strerror or exc}.") from exc
    if len(raw) > MAX_FILE_BYTES:
        raise TranscriptError(f"{path} is larger than {MAX_FILE_BYTES // 2**20} MiB; it is not a Sprig conversation.")
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise TranscriptError(f"{path} is not valid JSON ({exc}); it is not a Sprig conversation.") from exc
    if not isinstance(data, dict):
        raise TranscriptError(f"{path} holds JSON but not an object; it is not a Sprig conversation.")
    return data


def import_json(store: Store, data: dict) -> Conversation:
    """Add the chat in `data` (as written by `to_json`) to `store`, as a new conversation.
    Raises TranscriptError, having written nothing, if anything in it is wrong."""
    _check_header(data)
    overrides = _small_object(data.get("overrides"), "overrides") or {}
    created_at = _timestamp(data.get("created_at"), "created_at")
    messages = [_message_fields(message, f"messages[{index}]") for index, message in enumerate(data["messages"])]
    with store.transaction():
        conversation = store.create_conversation(data["title"], created_at=created_at)
        store.set_overrides(conversation.id, overrides)
        for fields in messages:
            store.add_message(conversation.id, **fields)
    return store.conversation(conversation.id)


def _check_header(data: object) -> None:
    """Check the format tag, version, title and message list of an imported chat."""
    if not isinstance(data, dict):
        raise TranscriptError("A Sprig conversation is a JSON object; this is not one.")
    if data.get("format") != FORMAT:
        raise TranscriptError(f"Not a Sprig conversation: 'format' is {data.get('format')!r}, not {FORMAT!r}.")
    if type(data.get("version")) is not int or data["version"] != VERSION:
        raise TranscriptError(
            f"Sprig conversation version {data.get('version')!r} is not one this Sprig reads (it reads {VERSION})."
        )
    _string(data.get("title"), "title", MAX_TITLE_CHARS)
    messages = data.get("messages")
    if not isinstance(messages, list):
        raise TranscriptError(f"messages must be a list, not {type(messages).__name__}.")
    if len(messages) > MAX_MESSAGES:
        raise TranscriptError(f"{len(messages)} messages is more than the {MAX_MESSAGES} a conversation may hold.")


def _message_fields(message: object, label: str) -> dict:
    """The checked keyword arguments of `Store.add_message` for one imported message."""
    if not isinstance(message, dict):
        raise TranscriptError(f"{label} must be an object.")
    role, state, model = message.get("role"), message.get("state", MessageState.COMPLETE), message.get("model")
    if role not in ROLES:
        raise TranscriptError(f"{label}.role must be one of {', '.join(ROLES)}, not {role!r}.")
    if state not in IMPORTABLE_STATES:
        raise TranscriptError(f"{label}.state must be one of {', '.join(IMPORTABLE_STATES)}, not {state!r}.")
    fields = {
        "role": role,
        "content": _string(message.get("content"), f"{label}.content", MAX_CONTENT_CHARS),
        "model": None if model is None else _string(model, f"{label}.model", MAX_TITLE_CHARS),
        "metrics": _small_object(message.get("metrics"), f"{label}.metrics"),
        "state": state,
        "created_at": _timestamp(message.get("created_at"), f"{label}.created_at"),
    }
    versions = message.get("versions", [])
    if "versions" not in label and versions:  # a version has no versions of its own
        if not isinstance(versions, list) or len(versions) > MAX_MESSAGES:
            raise TranscriptError(f"{label}.versions must be a list of at most {MAX_MESSAGES} versions.")
        active = message.get("active", 0)
        if type(active) is not int or not 0 <= active <= len(versions):
            raise TranscriptError(f"{label}.active must be a whole number from 0 to {len(versions)}.")
        fields["versions"] = tuple(
            _version_fields(version, role, f"{label}.versions[{index}]") for index, version in enumerate(versions)
        )
        fields["active"] = active
    return fields


def _version_fields(version: object, role: str, label: str) -> dict:
    """One checked earlier version of a message: its text, model, metrics and state, and the
    messages that followed it (`tail`, checked as messages without versions of their own)."""
    if not isinstance(version, dict):
        raise TranscriptError(f"{label} must be an object.")
    checked = _message_fields({**version, "role": role}, label)
    tail = version.get("tail", [])
    if not isinstance(tail, list) or len(tail) > MAX_MESSAGES:
        raise TranscriptError(f"{label}.tail must be a list of at most {MAX_MESSAGES} messages.")
    fields = {key: checked[key] for key in ("content", "model", "metrics", "state")}
    fields["tail"] = [_message_fields(later, f"{label}.tail[{index}]") for index, later in enumerate(tail)]
    return fields


def _string(value: object, label: str, max_chars: int) -> str:
    """`value`, checked to be a string of at most `max_chars` characters."""
    if not isinstance(value, str):
        raise TranscriptError(f"{label} must be a string, not {type(value).__name__}.")
    if len(value) > max_chars:
        raise TranscriptError(f"{label} is {len(value)} characters long; at most {max_chars} are allowed.")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise TranscriptError(f"{label} is not valid Unicode (it holds a lone surrogate).") from exc
    return value


def _small_object(value: object, label: str) -> dict | None:
    """`value`, checked to be null or a JSON object of at most MAX_OBJECT_CHARS, without NaN."""
    if value is None:
        return None
    if isinstance(value, dict):
        try:
            if len(json.dumps(value, allow_nan=False)) <= MAX_OBJECT_CHARS:
                return value
        except ValueError:  # NaN or infinity
            pass
    raise TranscriptError(f"{label} must be null or a JSON object of at most {MAX_OBJECT_CHARS} characters.")


def _timestamp(value: object, label: str) -> float | None:
    """`value`, checked to be null or a plausible number of seconds since 1970."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= MAX_TIMESTAMP:
        raise TranscriptError(f"{label} must be a time in seconds since 1970, not {value!r}.")
    return float(value)
