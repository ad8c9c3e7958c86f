"""Streams an endless answer into a history file the way the app saves one, until killed.

    python -m tests.app.storage_writer DBPATH

Token i of the answer is `token(i)`, one every ~20 ms, handed to a `ThrottledSaver`. After
each token it prints one line: its own clock (time.monotonic), the length generated so far,
and 1 if that call saved, else 0. test_storage.py kills it with SIGKILL mid-answer.
"""

import sys
import time

from app.storage import Store, ThrottledSaver

TOKEN_SECONDS = 0.02


def token(index: int) -> str:
    """The deterministic text of token `index`."""
    return f"w{index} "


def stream(path: str) -> None:
    """Create a chat with a streaming answer in `path` and grow it forever."""
    store = Store(path)
    chat = store.create_conversation("Killed mid-answer")
    store.add_message(chat.id, "user", "Count for me.")
    answer = store.add_message(chat.id, "assistant", "", model="writer", state="streaming")
    saver = ThrottledSaver(store, answer.id)
    text = ""
    index = 0
    while True:
        text += token(index)
        index += 1
        saved = saver.set_text(text)
        print(f"{time.monotonic():.6f} {len(text)} {int(saved)}", flush=True)
        time.sleep(TOKEN_SECONDS)


if __name__ == "__main__":
    stream(sys.argv[1])
