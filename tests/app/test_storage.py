"""The history file: schema and migrations, CRUD, search, and an answer that survives SIGKILL."""

import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from contextlib import closing
from pathlib import Path

import pytest

from app.storage import DEFAULT_DB_NAME, StorageError, Store, ThrottledSaver, default_db_path
from engine.remote.endpoints import Endpoint
from tests.app.storage_writer import token

ROOT = Path(__file__).resolve().parents[2]

# The schema as Sprig's first release wrote it (version 1), frozen here on purpose: files
# in users' hands look like this whatever later migrations do.
SCHEMA_V1 = """
CREATE TABLE conversations (id INTEGER PRIMARY KEY, title TEXT NOT NULL, created_at REAL NOT NULL,
    updated_at REAL NOT NULL);
CREATE TABLE messages (id INTEGER PRIMARY KEY,
    conversation_id INTEGER NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
    position INTEGER NOT NULL, role TEXT NOT NULL, content TEXT NOT NULL, model TEXT, metrics TEXT,
    state TEXT NOT NULL, created_at REAL NOT NULL, UNIQUE (conversation_id, position));
CREATE TABLE models (path TEXT PRIMARY KEY, name TEXT NOT NULL, added_at REAL NOT NULL, last_used REAL);
INSERT INTO conversations VALUES (1, 'Old chat', 100.0, 200.0);
INSERT INTO messages VALUES (1, 1, 0, 'user', 'Hello from v1', NULL, NULL, 'complete', 150.0);
INSERT INTO messages VALUES (2, 1, 1, 'assistant', 'Hi', 'smol', '{"decode_tokens": 1}', 'streaming', 160.0);
INSERT INTO models VALUES ('/m/smol.gguf', 'smol', 90.0, NULL);
PRAGMA user_version = 1;
"""


@pytest.fixture
def store(tmp_path):
    store = Store(tmp_path / "history.sqlite3")
    yield store
    store.close()


def reopen(store: Store) -> Store:
    """Close `store` and open its file again, as the next start of the app would."""
    store.close()
    return Store(store.path)


def later() -> None:
    """Wait until time.time() moves on, so that timestamps order (Windows' clock is coarse)."""
    start = time.time()
    while time.time() == start:
        time.sleep(0.001)


def raw(path: Path) -> closing:
    """A plain sqlite3 connection to `path`, in autocommit mode, closed on leaving `with`."""
    return closing(sqlite3.connect(path, isolation_level=None))


def write_v1_file(path: Path) -> None:
    """Write a history file as Sprig's schema version 1 left it, with some data."""
    with raw(path) as db:
        db.executescript(SCHEMA_V1)


# the file


def test_default_db_path_is_in_the_user_data_folder(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))  # keeps the test out of the real folder on Linux
    path = default_db_path()
    assert path.name == DEFAULT_DB_NAME
    assert path.parent.name == "Sprig" and path.parent.is_dir()


def test_new_file_is_in_wal_mode_at_the_latest_schema(store):
    assert store.schema_version == Store.SCHEMA_VERSION >= 2
    with raw(store.path) as other:
        assert other.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_v1_file_is_migrated_on_open_and_keeps_its_data(tmp_path):
    path = tmp_path / "v1.sqlite3"
    write_v1_file(path)
    store = Store(path)
    assert store.schema_version == Store.SCHEMA_VERSION
    [chat] = store.conversations()
    assert (chat.title, chat.created_at, chat.updated_at, chat.overrides) == ("Old chat", 100.0, 200.0, {})
    user, answer = store.messages(chat.id)
    assert (user.content, user.state) == ("Hello from v1", "complete")
    assert (answer.model, answer.metrics, answer.state) == ("smol", {"decode_tokens": 1}, "interrupted")
    assert [model.name for model in store.models()] == ["smol"]
    store.set_overrides(chat.id, {"temperature": 0.1})
    assert reopen(store).conversation(chat.id).overrides == {"temperature": 0.1}


def test_a_migrated_chat_names_its_model_by_uri_and_a_server_keeps_no_key(tmp_path):
    path = tmp_path / "v1.sqlite3"
    write_v1_file(path)
    store = Store(path)
    [chat] = store.conversations()
    assert chat.model_uri == "file:///m/smol.gguf"  # its answer's model, found in the library
    store.set_model_uri(chat.id, "openai+http://10.0.0.5:8000/v1#qwen")
    store.save_endpoint(Endpoint("GPU box", "http://10.0.0.5:8000/v1", verify_tls=False))
    with pytest.raises(ValueError, match="GPU box"):
        store.save_endpoint(Endpoint("GPU box", "http://other/v1"))
    again = reopen(store)
    assert again.conversation(chat.id).model_uri == "openai+http://10.0.0.5:8000/v1#qwen"
    assert again.endpoints() == [Endpoint("GPU box", "http://10.0.0.5:8000/v1", verify_tls=False)]
    assert [row[0] for row in again._db.execute("SELECT name FROM pragma_table_info('endpoints')")] == [
        "name", "base_url", "verify_tls", "extended_sampling", "added_at"
    ]  # fmt: skip


def test_failed_migration_step_leaves_the_file_as_it_was(tmp_path):
    path = tmp_path / "v1.sqlite3"
    write_v1_file(path)
    with raw(path) as db:  # an index name that version 2 wants to create
        db.execute("CREATE INDEX messages_streaming ON messages (position)")
    with pytest.raises(StorageError, match="already exists"):
        Store(path)
    with raw(path) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == 1
        columns = [row[1] for row in db.execute("PRAGMA table_info(conversations)")]
    assert "overrides" not in columns


def test_file_from_a_newer_sprig_is_refused(store):
    path = store.path
    store.close()
    with raw(path) as db:
        db.execute(f"PRAGMA user_version = {Store.SCHEMA_VERSION + 1}")
    with pytest.raises(StorageError, match="newer Sprig") as caught:
        Store(path)
    assert str(path) in str(caught.value)


def write_text_file(path: Path) -> None:
    """A file that is not SQLite at all."""
    path.write_text("Dear diary,\n" * 200)


def damage_schema_page(path: Path) -> None:
    """A real history file whose schema page was overwritten."""
    Store(path).close()
    with open(path, "r+b") as file:
        file.seek(100)  # past the 100-byte header, into the schema on page 1
        file.write(b"\xa5" * 1000)


@pytest.mark.parametrize("make_file", [write_text_file, damage_schema_page])
def test_damaged_or_foreign_file_is_refused_naming_it(tmp_path, make_file):
    path = tmp_path / "damaged.sqlite3"
    make_file(path)
    with pytest.raises(StorageError) as caught:
        Store(path)
    assert str(path) in str(caught.value)


def test_store_refuses_calls_from_another_thread(store):
    errors = []

    def list_conversations():
        try:
            store.conversations()
        except sqlite3.ProgrammingError as exc:
            errors.append(exc)

    thread = threading.Thread(target=list_conversations)
    thread.start()
    thread.join()
    assert len(errors) == 1 and "thread" in str(errors[0])


def test_transaction_writes_all_or_nothing(store):
    with pytest.raises(RuntimeError), store.transaction():
        chat = store.create_conversation("Half done")
        store.add_message(chat.id, "user", "Hello")
        raise RuntimeError("midway")
    assert store.conversations() == []


# conversations


def test_conversation_create_rename_delete(store):
    chat = store.create_conversation()
    assert (chat.title, chat.overrides) == ("New chat", {})
    assert chat.created_at == chat.updated_at > 0
    store.rename_conversation(chat.id, "Renamed")
    assert store.conversation(chat.id).title == "Renamed"
    store.delete_conversation(chat.id)
    assert store.conversations() == []
    with pytest.raises(KeyError):
        store.conversation(chat.id)


def test_deleting_a_conversation_deletes_its_messages(store):
    chat, other = store.create_conversation("a"), store.create_conversation("b")
    store.add_message(chat.id, "user", "gone")
    store.add_message(other.id, "user", "stays")
    store.delete_conversation(chat.id)
    assert store.messages(chat.id) == []
    assert [message.content for message in store.messages(other.id)] == ["stays"]


def test_conversations_list_newest_updated_first(store):
    first = store.create_conversation("first")
    later()
    second = store.create_conversation("second")
    assert [chat.title for chat in store.conversations()] == ["second", "first"]
    later()
    store.add_message(first.id, "user", "bump")
    assert [chat.title for chat in store.conversations()] == ["first", "second"]
    assert store.conversation(first.id).updated_at > store.conversation(second.id).updated_at


def test_search_matches_title_or_content_ignoring_case(store):
    pasta = store.create_conversation("Pasta recipes")
    physics = store.create_conversation("Über physics")
    store.add_message(physics.id, "user", "Explain the SCHRÖDINGER equation")
    store.create_conversation("100% done")

    def titles(search):
        return sorted(chat.title for chat in store.conversations(search))

    assert titles("pasta") == ["Pasta recipes"]
    assert titles("über") == ["Über physics"]
    assert titles("schrödinger") == ["Über physics"]
    assert titles("%") == ["100% done"]  # no LIKE wildcards
    assert titles("_") == []
    assert titles("nowhere") == []
    assert titles("") == sorted(["Pasta recipes", "Über physics", "100% done"])
    assert pasta.id in {chat.id for chat in store.conversations("RECIPES")}


def test_overrides_round_trip(store):
    chat = store.create_conversation()
    overrides = {"temperature": 0.2, "top_k": 10, "stop": ["\n\n"], "system_prompt": "Be brief."}
    store.set_overrides(chat.id, overrides)
    store = reopen(store)
    assert store.conversation(chat.id).overrides == overrides
    store.set_overrides(chat.id, {})
    assert store.conversation(chat.id).overrides == {}
    store.close()


# messages


def test_messages_are_appended_in_order_with_their_fields(store):
    chat = store.create_conversation()
    user = store.add_message(chat.id, "user", "Hi")
    answer = store.add_message(
        chat.id, "assistant", "Hello!", model="smol", metrics={"decode_tokens": 2}, state="cancelled"
    )
    system = store.add_message(chat.id, "system", "Be kind.")
    assert [m.position for m in (user, answer, system)] == [0, 1, 2]
    assert store.messages(chat.id) == [user, answer, system]
    assert (answer.conversation_id, answer.role, answer.content) == (chat.id, "assistant", "Hello!")
    assert (answer.model, answer.metrics, answer.state) == ("smol", {"decode_tokens": 2}, "cancelled")
    assert (user.model, user.metrics, user.state) == (None, None, "complete")


def test_update_message_changes_only_what_it_is_given(store):
    chat = store.create_conversation()
    answer = store.add_message(chat.id, "assistant", "", metrics={"decode_tokens": 0}, state="streaming")
    store.update_message(answer.id, "Hel")
    [saved] = store.messages(chat.id)
    assert (saved.content, saved.metrics, saved.state) == ("Hel", {"decode_tokens": 0}, "streaming")
    store.update_message(answer.id, "Hello", metrics={"decode_tokens": 2}, state="complete")
    [saved] = store.messages(chat.id)
    assert (saved.content, saved.metrics, saved.state) == ("Hello", {"decode_tokens": 2}, "complete")


@pytest.mark.parametrize("role, state", [("tool", "complete"), ("user", "done")])
def test_unknown_role_or_state_is_refused(store, role, state):
    chat = store.create_conversation()
    with pytest.raises(ValueError, match="must be one of"):
        store.add_message(chat.id, role, "x", state=state)
    assert store.messages(chat.id) == []


def test_delete_messages_from_a_position(store):
    chat, other = store.create_conversation(), store.create_conversation()
    for text in "abcd":
        store.add_message(chat.id, "user", text)
    store.add_message(other.id, "user", "other")
    store.delete_messages_from(chat.id, 2)
    assert [m.content for m in store.messages(chat.id)] == ["a", "b"]
    assert store.add_message(chat.id, "assistant", "regenerated").position == 2
    assert [m.content for m in store.messages(other.id)] == ["other"]


def test_streaming_messages_are_marked_interrupted_on_reopen(store):
    chat = store.create_conversation()
    for state in ("streaming", "complete", "cancelled", "error"):
        store.add_message(chat.id, "assistant", state, state=state)
    store = reopen(store)
    assert [m.state for m in store.messages(chat.id)] == ["interrupted", "complete", "cancelled", "error"]
    store.close()


# model library


def test_model_library_upsert_order_and_remove(store):
    store.add_model("/m/a.gguf", "A")
    later()
    store.add_model("/m/b.gguf", "B")
    later()
    store.add_model("/m/c.gguf", "C")
    assert [m.name for m in store.models()] == ["C", "B", "A"]  # none used yet: newest added first
    store.touch_model("/m/a.gguf")
    assert [m.name for m in store.models()] == ["A", "C", "B"]
    renamed = store.add_model("/m/a.gguf", "A renamed")
    [first] = [m for m in store.models() if m.path == "/m/a.gguf"]
    assert renamed == first and first.name == "A renamed" and first.last_used is not None
    assert len(store.models()) == 3
    store.remove_model("/m/b.gguf")
    assert [m.path for m in store.models()] == ["/m/a.gguf", "/m/c.gguf"]


# saving while streaming


def test_throttled_saver_saves_first_then_waits_then_flushes(store):
    chat = store.create_conversation()
    answer = store.add_message(chat.id, "assistant", "", state="streaming")
    saver = ThrottledSaver(store, answer.id, interval=60)
    assert saver.set_text("a") is True
    assert saver.set_text("ab") is False
    assert store.messages(chat.id)[0].content == "a"
    saver.flush(metrics={"decode_tokens": 2}, state="complete")
    [saved] = store.messages(chat.id)
    assert (saved.content, saved.metrics, saved.state) == ("ab", {"decode_tokens": 2}, "complete")


def test_throttled_saver_with_no_interval_saves_every_time(store):
    chat = store.create_conversation()
    answer = store.add_message(chat.id, "assistant", "", state="streaming")
    saver = ThrottledSaver(store, answer.id, interval=0)
    for text in ("a", "ab", "abc"):
        assert saver.set_text(text) is True
        assert store.messages(chat.id)[0].content == text


@pytest.mark.skipif(sys.platform == "win32", reason="Windows has no SIGKILL to kill the writer with")
def test_answer_survives_sigkill(tmp_path):
    path = tmp_path / "killed.sqlite3"
    writer = subprocess.Popen(
        [sys.executable, "-m", "tests.app.storage_writer", str(path)], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    progress = []  # (writer's clock, length generated by then), one per token
    saves = 0
    deadline = time.monotonic() + 120
    try:
        # Kill after two seconds of the writer's own time, whenever its last save was.
        while not progress or progress[-1][0] - progress[0][0] < 2.0:
            line = writer.stdout.readline()
            assert line, f"the writer stopped early with status {writer.poll()}"
            clock, generated, saved = line.split()
            progress.append((float(clock), int(generated)))
            saves += int(saved)
            assert time.monotonic() < deadline, "the writer is far too slow"
        os.kill(writer.pid, signal.SIGKILL)
    finally:
        writer.kill()  # in case the loop above failed; a no-op after os.kill
        writer.wait(timeout=60)
        writer.stdout.close()
    assert writer.returncode == -signal.SIGKILL
    # What had been generated one second (of the writer's own time) before its last line.
    last_clock, _ = progress[-1]
    floor = max(generated for clock, generated in progress if clock <= last_clock - 1.0)

    with raw(path) as db:  # as the kill left it, before Store marks it
        assert db.execute("SELECT state FROM messages WHERE role = 'assistant'").fetchone()[0] == "streaming"
    store = Store(path)
    [chat] = store.conversations()
    user, answer = store.messages(chat.id)
    store.close()
    assert (user.role, user.content) == ("user", "Count for me.")
    assert (answer.role, answer.state) == ("assistant", "interrupted")
    assert answer.content == "".join(map(token, range(answer.content.count(" "))))  # whole tokens, in order
    assert saves >= 2, "the answer is saved while it streams, not only at the end"
    assert 0 < floor <= len(answer.content)
