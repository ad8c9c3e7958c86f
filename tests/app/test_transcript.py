"""Export to Markdown and JSON, and strict JSON import."""

import copy
import json

import pytest

from app.storage import Store
from app.transcript import TranscriptError, import_json, read_json_file, to_json, to_markdown

CODE_ANSWER = "Here it is:\n\n```python\ndef add(a, b):\n    return a + b\n```\n\nDone."


@pytest.fixture
def store(tmp_path):
    store = Store(tmp_path / "history.sqlite3")
    yield store
    store.close()


@pytest.fixture
def chat(store):
    """A chat with every kind of message, overrides, metrics and an unfinished answer."""
    chat = store.create_conversation("Adding numbers")
    store.set_overrides(chat.id, {"temperature": 0.3, "stop": ["\n\n"]})
    store.add_message(chat.id, "system", "You write Python.")
    store.add_message(chat.id, "user", "Write add().")
    metrics = {"decode_tokens": 12, "decode_tok_s": 30.04, "time_to_first_token_s": 0.151, "context_used": 40}
    store.add_message(chat.id, "assistant", CODE_ANSWER, model="SmolLM2-135M", metrics=metrics)
    store.add_message(chat.id, "user", "Again?")
    store.add_message(chat.id, "assistant", "Sure, here", model="SmolLM2-135M", state="cancelled")
    return store.conversation(chat.id)


def snapshot(store: Store) -> list:
    """Everything in the store's chats, to compare before and after a failed import."""
    return [(chat, store.messages(chat.id)) for chat in store.conversations()]


def test_json_round_trip_through_a_file_gives_the_same_chat(store, chat, tmp_path):
    path = tmp_path / "chat.json"
    path.write_text(json.dumps(to_json(chat, store.messages(chat.id))), encoding="utf-8")
    other = Store(tmp_path / "other.sqlite3")
    imported = import_json(other, read_json_file(path))
    copied = other.messages(imported.id)
    other.close()
    assert (imported.title, imported.created_at, imported.overrides) == (chat.title, chat.created_at, chat.overrides)

    def fields(messages):
        return [(m.position, m.role, m.content, m.model, m.metrics, m.state, m.created_at) for m in messages]

    assert fields(copied) == fields(store.messages(chat.id))


def test_markdown_has_headings_verbatim_content_and_metrics(store, chat):
    markdown = to_markdown(chat, store.messages(chat.id))
    assert markdown.startswith("# Adding numbers\n\n## System\n\nYou write Python.\n\n## User\n\nWrite add().\n\n")
    assert f"## Assistant (SmolLM2-135M)\n\n{CODE_ANSWER}\n\n*12 tokens · 30.0 tok/s · TTFT 0.15 s*\n\n" in markdown
    assert markdown.endswith("## Assistant (SmolLM2-135M)\n\nSure, here\n\n*cancelled*\n")


def valid_export() -> dict:
    """A small hand-written export that imports cleanly."""
    return {
        "format": "sprig-conversation",
        "version": 1,
        "title": "Imported",
        "created_at": 1_700_000_000.0,
        "overrides": {},
        "messages": [
            {"role": "user", "content": "Hi", "model": None, "metrics": None, "created_at": 1_700_000_001.0},
            {"role": "assistant", "content": "Hello", "model": "m", "metrics": {"decode_tokens": 1}},
        ],
    }


def broken(change) -> dict:
    """`valid_export()` with `change` applied to it."""
    data = copy.deepcopy(valid_export())
    change(data)
    return data


MALFORMED = {
    "not an object": ["sprig-conversation"],
    "wrong format tag": broken(lambda d: d.update(format="chatgpt-export")),
    "newer version": broken(lambda d: d.update(version=2)),
    "version as text": broken(lambda d: d.update(version="1")),
    "no title": broken(lambda d: d.pop("title")),
    "missing messages": broken(lambda d: d.pop("messages")),
    "messages not a list": broken(lambda d: d.update(messages={"role": "user"})),
    "message not an object": broken(lambda d: d["messages"].append("Hi")),
    "bad role": broken(lambda d: d["messages"][1].update(role="tool")),
    "missing role": broken(lambda d: d["messages"][1].pop("role")),
    "non-string content": broken(lambda d: d["messages"][1].update(content=["Hello"])),
    "lone surrogate": broken(lambda d: d["messages"][1].update(content="\ud800")),
    "content too long": broken(lambda d: d["messages"][1].update(content="x" * 4_000_001)),
    "non-string model": broken(lambda d: d["messages"][1].update(model=7)),
    "metrics not an object": broken(lambda d: d["messages"][1].update(metrics=[1, 2])),
    "NaN in metrics": broken(lambda d: d["messages"][1].update(metrics={"decode_tok_s": float("nan")})),
    "streaming state": broken(lambda d: d["messages"][1].update(state="streaming")),
    "time as text": broken(lambda d: d["messages"][0].update(created_at="yesterday")),
    "time as boolean": broken(lambda d: d.update(created_at=True)),
    "overrides not an object": broken(lambda d: d.update(overrides="hot")),
}


def test_valid_export_imports(store):
    imported = import_json(store, valid_export())
    assert [(m.role, m.content, m.state) for m in store.messages(imported.id)] == [
        ("user", "Hi", "complete"), ("assistant", "Hello", "complete")
    ]


@pytest.mark.parametrize("data", MALFORMED.values(), ids=MALFORMED.keys())
def test_malformed_import_raises_and_writes_nothing(store, chat, data):
    before = snapshot(store)
    with pytest.raises(TranscriptError):
        import_json(store, data)
    assert snapshot(store) == before


def test_transcript_error_is_a_value_error():
    assert issubclass(TranscriptError, ValueError)


@pytest.mark.parametrize(
    "content, reason",
    [(b'{"format": "sprig-conversation", ', "not valid JSON"), (b"\xff\xfe garbage", "not valid JSON"),
     (b"[1, 2]", "not an object"), (b"[" * 100_000, "not valid JSON")],
    ids=["truncated", "not UTF-8", "array", "deep nesting"],
)
def test_unreadable_json_file_names_the_file(tmp_path, content, reason):
    path = tmp_path / "chat.json"
    path.write_bytes(content)
    with pytest.raises(TranscriptError, match=reason) as caught:
        read_json_file(path)
    assert str(path) in str(caught.value)


def test_missing_json_file_names_the_file(tmp_path):
    path = tmp_path / "absent.json"
    with pytest.raises(TranscriptError, match="Cannot read") as caught:
        read_json_file(path)
    assert str(path) in str(caught.value)
