"""Chat history and model library in one SQLite file, Qt-free.

The file is in WAL mode, so every commit survives the app being killed: a streamed answer
is saved as it grows (see `ThrottledSaver`), and a message found still "streaming" when the
file is next opened is marked "interrupted". The schema is versioned by `PRAGMA
user_version`; `MIGRATIONS[n]` takes a file from version n to n + 1, in one transaction.
"""

import json
import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

import platformdirs

from app.model_settings import ModelSettings, file_fingerprint
from engine.errors import SprigError
from engine.model_uri import local_uri, remote_uri
from engine.remote.endpoints import Endpoint

DEFAULT_DB_NAME = "sprig.sqlite3"
SNIPPET_CHARS = 60  # the length of a search result's snippet

ROLES = ("system", "user", "assistant")
CUT_AT_LIMIT = "length"  # metrics["finish_reason"] of an answer cut by the token limit
CUT_BY_CONTEXT = "context_full"  # metrics["finish_reason"] of an answer cut because the context was full


class MessageState(StrEnum):
    """Where a message stands; stored in the `state` column as its value."""

    COMPLETE = "complete"
    STREAMING = "streaming"  # being written now; found at startup, it becomes INTERRUPTED
    INTERRUPTED = "interrupted"  # the app closed while it was being written
    CANCELLED = "cancelled"  # the user pressed Stop
    ERROR = "error"  # the engine failed; the message's metrics["error"] says why


def ended_early(state: str, metrics: dict | None) -> bool:
    """Whether an answer stopped before the model was done: Stop, a closed app, the token limit, a full context."""
    early = state in (MessageState.CANCELLED, MessageState.INTERRUPTED)
    return early or (metrics or {}).get("finish_reason") in (CUT_AT_LIMIT, CUT_BY_CONTEXT)


def _name_conversation_models(db: sqlite3.Connection) -> None:
    """Migration 4's data step: each chat names the library file whose name its last answer carries."""
    rows = db.execute(
        """SELECT c.id, (SELECT mo.path FROM messages AS me JOIN models AS mo ON mo.name = me.model
                         WHERE me.conversation_id = c.id AND me.role = 'assistant'
                         ORDER BY me.position DESC LIMIT 1) AS path
           FROM conversations AS c"""
    ).fetchall()
    for conversation_id, path in rows:
        if path and Path(path).is_absolute():
            db.execute("UPDATE conversations SET model_uri = ? WHERE id = ?", (local_uri(path), conversation_id))


Migration = str | Callable[[sqlite3.Connection], None]  # an SQL statement, or a step that needs Python

MIGRATIONS: tuple[tuple[Migration, ...], ...] = (
    # 1: the base schema.
    (
        """CREATE TABLE conversations (
            id INTEGER PRIMARY KEY,
            title TEXT NOT NULL,
            created_at REAL NOT NULL,
            updated_at REAL NOT NULL)""",
        """CREATE TABLE messages (
            id INTEGER PRIMARY KEY,
            conversation_id INTEGER NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
            position INTEGER NOT NULL,
            role TEXT NOT NULL,
            content TEXT NOT NULL,
            model TEXT,
            metrics TEXT,
            state TEXT NOT NULL,
            created_at REAL NOT NULL,
            UNIQUE (conversation_id, position))""",
        """CREATE TABLE models (
            path TEXT PRIMARY KEY,
            name TEXT NOT NULL,
            added_at REAL NOT NULL,
            last_used REAL)""",
    ),
    # 2: per-conversation sampling overrides, and an index that finds the answers left
    # streaming by a killed app without scanning every message at each start.
    (
        "ALTER TABLE conversations ADD COLUMN overrides TEXT NOT NULL DEFAULT '{}'",
        "CREATE INDEX messages_streaming ON messages (id) WHERE state = 'streaming'",
    ),
    # 3: the other versions of a message (earlier answers kept by Regenerate), as a JSON
    # list of {content, model, metrics, state}, and where the shown one sits among them all.
    (
        "ALTER TABLE messages ADD COLUMN versions TEXT NOT NULL DEFAULT '[]'",
        "ALTER TABLE messages ADD COLUMN active INTEGER NOT NULL DEFAULT 0",
    ),
    # 4: per-model settings (app/model_settings.py), keyed by the file's path; the file's name
    # and size find them again after the file moves.
    (
        """CREATE TABLE model_settings (
            path TEXT PRIMARY KEY,
            file_name TEXT NOT NULL,
            file_size INTEGER NOT NULL,
            settings TEXT NOT NULL)""",
    ),
    # 5: remote models. A chat names its model by a URI (engine.model_uri): a local file's, or a
    # server's and a model id; older chats get their library file's, where their answers name one.
    # The servers the user added (their API keys are in the keyring, never here).
    (
        "ALTER TABLE conversations ADD COLUMN model_uri TEXT",
        _name_conversation_models,
        """CREATE TABLE endpoints (
            name TEXT PRIMARY KEY,
            base_url TEXT NOT NULL,
            verify_tls INTEGER NOT NULL,
            extended_sampling INTEGER NOT NULL,
            added_at REAL NOT NULL)""",
    ),
)

CONVERSATION_COLUMNS = "id, title, created_at, updated_at, overrides, model_uri"
MESSAGE_COLUMNS = "id, conversation_id, position, role, content, model, metrics, state, created_at, versions, active"


class StorageError(SprigError):
    """The history file cannot be opened: damaged, not SQLite, or from a newer Sprig."""


def default_db_path() -> Path:
    """The history file in the user's data folder, which is created if missing."""
    return platformdirs.user_data_path("Sprig", appauthor=False, ensure_exists=True) / DEFAULT_DB_NAME


@dataclass(frozen=True)
class Conversation:
    """One chat. `overrides` holds its sampling settings that differ from the defaults;
    `model_uri` names the model that last answered in it (engine.model_uri), if known."""

    id: int
    title: str
    created_at: float
    updated_at: float
    overrides: dict
    model_uri: str | None = None


@dataclass(frozen=True)
class Message:
    """One turn of a chat; `state` is a `MessageState`.

    `versions` are the message's other versions (dicts of content, model, metrics, state),
    and `active` is where the shown one sits among all of them, counting from 0.
    """

    id: int
    conversation_id: int
    position: int
    role: str
    content: str
    model: str | None
    metrics: dict | None
    state: MessageState
    created_at: float
    versions: tuple[dict, ...] = ()
    active: int = 0

    def all_versions(self) -> list[dict]:
        """Every version in order, the shown one included."""
        shown = {"content": self.content, "model": self.model, "metrics": self.metrics, "state": self.state}
        return [*self.versions[: self.active], shown, *self.versions[self.active :]]


@dataclass(frozen=True)
class LibraryModel:
    """A model file the user added to the library."""

    path: str
    name: str
    added_at: float
    last_used: float | None


def _conversation(row: sqlite3.Row) -> Conversation:
    return Conversation(
        row["id"], row["title"], row["created_at"], row["updated_at"], json.loads(row["overrides"]), row["model_uri"]
    )


def _message(row: sqlite3.Row) -> Message:
    metrics = None if row["metrics"] is None else json.loads(row["metrics"])
    return Message(
        row["id"],
        row["conversation_id"],
        row["position"],
        row["role"],
        row["content"],
        row["model"],
        metrics,
        MessageState(row["state"]),
        row["created_at"],
        tuple(json.loads(row["versions"])),
        row["active"],
    )


def _json_or_none(value: dict | None) -> str | None:
    return None if value is None else json.dumps(value)


def _check_choice(value: str, allowed: tuple[str, ...], what: str) -> None:
    if value not in allowed:
        raise ValueError(f"{what} must be one of {', '.join(allowed)}, not {value!r}")


class Store:
    """The history file, open. Use it from one thread only (the GUI thread).

    The connection keeps sqlite3's `check_same_thread=True`, so a call from another thread
    fails at once instead of racing. The connection is in autocommit mode: each write
    method commits before it returns, and `transaction()` groups several into one.
    """

    SCHEMA_VERSION = len(MIGRATIONS)

    def __init__(self, path: Path | str):
        """Open or create the file at `path`, bring its schema up to date, and mark the
        answers a killed app left streaming as interrupted. Raises StorageError."""
        self.path = Path(path)
        try:
            self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=True)
        except sqlite3.DatabaseError as exc:
            raise self._unusable(exc) from exc
        try:
            self._prepare()
        except BaseException as exc:
            self._db.close()
            if isinstance(exc, sqlite3.DatabaseError):
                raise self._unusable(exc) from exc
            raise

    def _unusable(self, exc: sqlite3.DatabaseError) -> StorageError:
        """The error to raise when SQLite cannot open or read the file."""
        return StorageError(
            f"Cannot open the chat history {self.path}: {exc}. The file is damaged, unreadable or "
            "not a Sprig history; move it elsewhere and Sprig will start a new one."
        )

    def _prepare(self) -> None:
        """Set up the connection and the file: schema, WAL, foreign keys, interrupted answers."""
        self._db.row_factory = sqlite3.Row
        self._db.create_function("casefold", 1, str.casefold, deterministic=True)
        self._migrate()
        self._db.execute("PRAGMA journal_mode = WAL")
        self._db.execute("PRAGMA synchronous = NORMAL")  # durable across app crashes in WAL mode
        self._db.execute("PRAGMA foreign_keys = ON")
        self._db.execute(
            "UPDATE messages SET state = ? WHERE state = ?", (MessageState.INTERRUPTED, MessageState.STREAMING)
        )

    def _migrate(self) -> None:
        """Apply the migrations the file lacks, each in its own transaction."""
        version = self.schema_version
        if version > self.SCHEMA_VERSION:
            raise StorageError(
                f"The chat history {self.path} was written by a newer Sprig (schema version "
                f"{version}; this Sprig knows up to {self.SCHEMA_VERSION}). Update Sprig, or "
                "move the file elsewhere to start a new history."
            )
        for number in range(version + 1, self.SCHEMA_VERSION + 1):
            with self.transaction():
                for statement in MIGRATIONS[number - 1]:
                    if callable(statement):
                        statement(self._db)
                    else:
                        self._db.execute(statement)
                self._db.execute(f"PRAGMA user_version = {number}")

    def close(self) -> None:
        """Close the file; the Store cannot be used afterwards."""
        self._db.close()

    @property
    def schema_version(self) -> int:
        """The schema version recorded in the file (`PRAGMA user_version`)."""
        return self._db.execute("PRAGMA user_version").fetchone()[0]

    @property
    def journal_mode(self) -> str:
        """SQLite's journal mode for this file: "wal" on disk ("memory" for ":memory:")."""
        return self._db.execute("PRAGMA journal_mode").fetchone()[0]

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """Make the writes inside the block all happen or, if it raises, none. Nests."""
        self._db.execute("SAVEPOINT store")
        try:
            yield
        except BaseException:
            self._db.execute("ROLLBACK TO store")
            self._db.execute("RELEASE store")
            raise
        self._db.execute("RELEASE store")

    # conversations

    def create_conversation(self, title: str = "New chat", *, created_at: float | None = None) -> Conversation:
        """Start an empty chat; `created_at` defaults to now (import keeps the original)."""
        now = time.time()
        cursor = self._db.execute(
            "INSERT INTO conversations (title, created_at, updated_at) VALUES (?, ?, ?)",
            (title, now if created_at is None else created_at, now),
        )
        assert cursor.lastrowid is not None  # an INSERT sets it
        return self.conversation(cursor.lastrowid)

    def rename_conversation(self, conversation_id: int, title: str) -> None:
        """Give a chat a new title."""
        self._db.execute("UPDATE conversations SET title = ? WHERE id = ?", (title, conversation_id))

    def delete_conversation(self, conversation_id: int) -> None:
        """Delete a chat and all its messages."""
        self._db.execute("DELETE FROM conversations WHERE id = ?", (conversation_id,))

    def conversation(self, conversation_id: int) -> Conversation:
        """The chat with this id; KeyError if there is none."""
        row = self._db.execute(
            f"SELECT {CONVERSATION_COLUMNS} FROM conversations WHERE id = ?", (conversation_id,)
        ).fetchone()
        if row is None:
            raise KeyError(f"no conversation with id {conversation_id}")
        return _conversation(row)

    def conversations(self, search: str = "") -> list[Conversation]:
        """Chats, most recently updated first. A non-empty `search` keeps those whose title
        or any message contains it, ignoring case."""
        rows = self._db.execute(
            f"""SELECT {CONVERSATION_COLUMNS} FROM conversations AS c
                WHERE :needle = ''
                   OR instr(casefold(c.title), :needle)
                   OR EXISTS (SELECT 1 FROM messages AS m
                              WHERE m.conversation_id = c.id AND instr(casefold(m.content), :needle))
                ORDER BY c.updated_at DESC, c.id DESC""",
            {"needle": search.casefold()},
        )
        return [_conversation(row) for row in rows]

    def snippet(self, conversation_id: int, search: str, width: int = SNIPPET_CHARS) -> str:
        """The text around the first match of `search` in a chat (title first, then messages).

        About `width` characters on one line, with "…" where it was cut; "" if nothing matches.
        """
        needle = search.casefold()
        title = self.conversation(conversation_id).title
        texts = [title] + [m.content for m in self.messages(conversation_id)]
        for text in texts:
            at = text.casefold().find(needle) if needle else -1
            if at >= 0:
                start = max(0, at - width // 3)
                piece = " ".join(text[start : start + width].split())
                return ("…" if start > 0 else "") + piece + ("…" if start + width < len(text) else "")
        return ""

    def set_overrides(self, conversation_id: int, overrides: dict) -> None:
        """Replace a chat's sampling overrides ({} for none)."""
        self._db.execute(
            "UPDATE conversations SET overrides = ? WHERE id = ?", (json.dumps(overrides), conversation_id)
        )

    def set_model_uri(self, conversation_id: int, uri: str) -> None:
        """Record which model (its URI) answers in a chat."""
        self._db.execute("UPDATE conversations SET model_uri = ? WHERE id = ?", (uri, conversation_id))

    # messages

    def add_message(
        self,
        conversation_id: int,
        role: str,
        content: str,
        *,
        model: str | None = None,
        metrics: dict | None = None,
        state: MessageState = MessageState.COMPLETE,
        created_at: float | None = None,
        versions: tuple[dict, ...] = (),
        active: int = 0,
    ) -> Message:
        """Append a message to a chat, which becomes the most recently updated one.
        `created_at` defaults to now (import keeps the original); `versions` and `active`
        are its other versions and the shown one's place among them (see `Message`)."""
        _check_choice(role, ROLES, "role")
        _check_choice(state, tuple(MessageState), "state")
        now = time.time()
        with self.transaction():
            cursor = self._db.execute(
                """INSERT INTO messages (conversation_id, position, role, content, model, metrics, state, created_at,
                                        versions, active)
                   SELECT :conversation, COALESCE(MAX(position) + 1, 0), :role, :content, :model, :metrics,
                          :state, :created_at, :versions, :active
                   FROM messages WHERE conversation_id = :conversation""",
                {
                    "conversation": conversation_id,
                    "role": role,
                    "content": content,
                    "model": model,
                    "metrics": _json_or_none(metrics),
                    "state": state,
                    "created_at": now if created_at is None else created_at,
                    "versions": json.dumps(list(versions)),
                    "active": min(max(active, 0), len(versions)),
                },
            )
            self._db.execute("UPDATE conversations SET updated_at = ? WHERE id = ?", (now, conversation_id))
            row = self._db.execute(f"SELECT {MESSAGE_COLUMNS} FROM messages WHERE id = ?", (cursor.lastrowid,))
            return _message(row.fetchone())

    def update_message(
        self, message_id: int, content: str, *, metrics: dict | None = None, state: MessageState | None = None
    ) -> None:
        """Replace a message's content, and its metrics and state where given.
        One UPDATE and commit: cheap enough to call many times a second while streaming."""
        if state is not None:
            _check_choice(state, tuple(MessageState), "state")
        self._db.execute(
            """UPDATE messages SET content = ?, metrics = COALESCE(?, metrics), state = COALESCE(?, state)
               WHERE id = ?""",
            (content, _json_or_none(metrics), state, message_id),
        )

    def message(self, message_id: int) -> Message:
        """One message by its id."""
        row = self._db.execute(f"SELECT {MESSAGE_COLUMNS} FROM messages WHERE id = ?", (message_id,)).fetchone()
        if row is None:
            raise KeyError(f"no message {message_id}")
        return _message(row)

    def new_version(
        self,
        message_id: int,
        content: str = "",
        *,
        model: str | None = None,
        state: MessageState = MessageState.STREAMING,
    ) -> Message:
        """Start a new last version of a message, with `content`, keeping the shown one.

        The messages after it (the answers to an edited question) go with the version they
        followed, as its `tail`, and come back when that version is shown again.
        """
        _check_choice(state, tuple(MessageState), "state")
        message = self.message(message_id)
        with self.transaction():
            versions = self._versions_with_tail(message)
            self._db.execute(
                "UPDATE messages SET content = ?, model = ?, metrics = NULL, state = ?, versions = ?, active = ? "
                "WHERE id = ?",
                (content, model, state, json.dumps(versions), len(versions), message_id),
            )
        return self.message(message_id)

    def show_version(self, message_id: int, index: int) -> Message:
        """Show version `index` (from 0) of a message, with the messages that followed it."""
        message = self.message(message_id)
        versions = message.all_versions()
        if not 0 <= index < len(versions):
            raise IndexError(f"message {message_id} has {len(versions)} versions, not {index + 1}")
        with self.transaction():
            versions = self._versions_with_tail(message)
            shown = versions.pop(index)
            self._db.execute(
                "UPDATE messages SET content = ?, model = ?, metrics = ?, state = ?, versions = ?, active = ? "
                "WHERE id = ?",
                (
                    shown["content"],
                    shown["model"],
                    _json_or_none(shown["metrics"]),
                    shown["state"],
                    json.dumps(versions),
                    index,
                    message_id,
                ),
            )
            for later in shown.get("tail", []):
                self.add_message(message.conversation_id, **later)
        return self.message(message_id)

    def _versions_with_tail(self, message: Message) -> list[dict]:
        """All versions of `message`; the shown one takes the later messages along, which are deleted."""
        later = [m for m in self.messages(message.conversation_id) if m.position > message.position]
        versions = message.all_versions()
        versions[message.active]["tail"] = [
            {
                "role": m.role,
                "content": m.content,
                "model": m.model,
                "metrics": m.metrics,
                "state": m.state,
                "created_at": m.created_at,
                "versions": m.versions,
                "active": m.active,
            }
            for m in later
        ]
        self.delete_messages_from(message.conversation_id, message.position + 1)
        return versions

    def messages(self, conversation_id: int) -> list[Message]:
        """A chat's messages, in order."""
        rows = self._db.execute(
            f"SELECT {MESSAGE_COLUMNS} FROM messages WHERE conversation_id = ? ORDER BY position",
            (conversation_id,),
        )
        return [_message(row) for row in rows]

    def delete_messages_from(self, conversation_id: int, position: int) -> None:
        """Delete the message at `position` and every later one (to edit or regenerate)."""
        self._db.execute(
            "DELETE FROM messages WHERE conversation_id = ? AND position >= ?", (conversation_id, position)
        )

    # model library

    def add_model(self, path: str, name: str) -> LibraryModel:
        """Add a model file to the library, or rename the entry already there for `path`."""
        self._db.execute(
            """INSERT INTO models (path, name, added_at) VALUES (?, ?, ?)
               ON CONFLICT (path) DO UPDATE SET name = excluded.name""",
            (path, name, time.time()),
        )
        row = self._db.execute("SELECT path, name, added_at, last_used FROM models WHERE path = ?", (path,))
        return LibraryModel(*row.fetchone())

    def remove_model(self, path: str) -> None:
        """Take a model file out of the library (the file itself is left alone)."""
        self._db.execute("DELETE FROM models WHERE path = ?", (path,))

    def models(self) -> list[LibraryModel]:
        """The library: most recently used first, then never-used ones newest added first."""
        rows = self._db.execute(
            """SELECT path, name, added_at, last_used FROM models
               ORDER BY last_used IS NULL, last_used DESC, added_at DESC, rowid DESC"""
        )
        return [LibraryModel(*row) for row in rows]

    # remote servers

    def endpoints(self) -> list[Endpoint]:
        """The servers the user added, by name."""
        rows = self._db.execute(
            "SELECT name, base_url, verify_tls, extended_sampling FROM endpoints ORDER BY casefold(name)"
        )
        return [Endpoint(r["name"], r["base_url"], bool(r["verify_tls"]), bool(r["extended_sampling"])) for r in rows]

    def save_endpoint(self, endpoint: Endpoint, replacing: Endpoint | None = None) -> None:
        """Add a server, or put it in place of `replacing` (edited); ValueError if another has its name.

        An edited server's new address goes into the chats that name its models, so they still do.
        """
        with self.transaction():
            if replacing is not None:
                self._db.execute("DELETE FROM endpoints WHERE name = ?", (replacing.name,))
                if replacing.base_url != endpoint.base_url:
                    old, new = remote_uri(replacing.base_url, ""), remote_uri(endpoint.base_url, "")
                    self._db.execute(
                        "UPDATE conversations SET model_uri = ? || substr(model_uri, ?) "
                        "WHERE substr(model_uri, 1, ?) = ?",
                        (new, len(old) + 1, len(old), old),
                    )
            try:
                self._db.execute(
                    "INSERT INTO endpoints (name, base_url, verify_tls, extended_sampling, added_at) "
                    "VALUES (?, ?, ?, ?, ?)",
                    (endpoint.name, endpoint.base_url, endpoint.verify_tls, endpoint.extended_sampling, time.time()),
                )
            except sqlite3.IntegrityError:
                raise ValueError(f"A server called “{endpoint.name}” exists; give this one another name.") from None

    def remove_endpoint(self, name: str) -> None:
        """Forget a server (its key is the keyring's business). Chats with its models keep their URIs."""
        self._db.execute("DELETE FROM endpoints WHERE name = ?", (name,))

    def touch_model(self, path: str) -> None:
        """Record that a model was just used."""
        self._db.execute("UPDATE models SET last_used = ? WHERE path = ?", (time.time(), path))

    # per-model settings

    def model_settings(self, path: str | Path) -> ModelSettings:
        """The settings kept for the model file at `path` (empty ones if none).

        A file that moved has none under its new path: then the settings of a file with the
        same name and size whose old path no longer exists become this path's.
        """
        path = str(path)
        row = self._db.execute("SELECT settings FROM model_settings WHERE path = ?", (path,)).fetchone()
        if row is not None:
            return ModelSettings.from_json(row["settings"])
        fingerprint = file_fingerprint(Path(path))
        if fingerprint is None:
            return ModelSettings()
        rows = self._db.execute(
            "SELECT path, settings FROM model_settings WHERE file_name = ? AND file_size = ?", fingerprint
        ).fetchall()
        moved = next((r for r in rows if not Path(r["path"]).exists()), None)
        if moved is None:
            return ModelSettings()
        self._db.execute("UPDATE model_settings SET path = ? WHERE path = ?", (path, moved["path"]))
        return ModelSettings.from_json(moved["settings"])

    def set_model_settings(self, path: str | Path, settings: ModelSettings) -> None:
        """Keep `settings` for the model file at `path` (empty settings are forgotten).

        Raises StorageError when the file does not exist (its settings could not be found again)."""
        if settings.empty:
            self._db.execute("DELETE FROM model_settings WHERE path = ?", (str(path),))
            return
        fingerprint = file_fingerprint(Path(path))
        if fingerprint is None:
            raise StorageError(f"{path} does not exist, so no settings can be kept for it; it may have been moved.")
        self._db.execute(
            """INSERT INTO model_settings (path, file_name, file_size, settings) VALUES (?, ?, ?, ?)
               ON CONFLICT (path) DO UPDATE SET file_name = excluded.file_name, file_size = excluded.file_size,
               settings = excluded.settings""",
            (str(path), *fingerprint, settings.to_json()),
        )


class ThrottledSaver:
    """Saves a message that grows while it streams, at most once per `interval` seconds.

    A killed app then loses at most the last `interval` of an answer. Call `set_text` with
    the whole text so far on every token, and `flush` once at the end.
    """

    def __init__(self, store: Store, message_id: int, interval: float = 0.25, text: str = ""):
        """Save message `message_id` of `store`, whose text is `text` so far; the first
        `set_text` saves at once."""
        self._store = store
        self._message_id = message_id
        self._interval = interval
        self._text = text
        self._saved_at = float("-inf")

    def set_text(self, text: str) -> bool:
        """Take the text so far; save it if `interval` has passed since the last save.
        Returns whether it saved."""
        self._text = text
        if time.monotonic() - self._saved_at < self._interval:
            return False
        self.flush()
        return True

    def flush(self, metrics: dict | None = None, state: MessageState | None = None) -> None:
        """Save the latest text now, with the metrics and state if given."""
        self._store.update_message(self._message_id, self._text, metrics=metrics, state=state)
        self._saved_at = time.monotonic()
