"""The app's saved conversation states: each conversation's KV cache kept beside the
chat history when it is left or the app closes, and restored when it answers again.

The chat has one session per loaded model, whose cache holds the conversation that
answered last. Before an answer the session is told which conversation it serves
(`attach`), so that it restores that conversation's saved state in place of reading its
text again (`engine.saved_state`). Leaving the conversation saves the cache on the engine
thread (`leave`), behind any job already queued and before the next one; a model let go
(a switch to another model, an unload) saves it on the engine thread before the session
goes, and closing the app saves it with the window already hidden, once the engine thread
has stopped (`save_now`, which the model host calls). The folder is `states/` beside the
database, within the `saved_states_mb` setting.
"""

import logging
from collections.abc import Callable
from pathlib import Path

from app.worker import Job, Worker
from engine.chat_session import ChatSession
from engine.saved_state import ConversationState, SavedStates, identity_of

log = logging.getLogger(__name__)

FOLDER = "states"


def conversation_key(conversation_id: int) -> str:
    """The name of a conversation's saved state."""
    return f"conversation-{conversation_id}"


class ConversationStates:
    """Saved states of the conversations of a store whose database is `database`
    (none for a database in memory), under a cap of `cap_mb()` megabytes."""

    def __init__(self, database: Path, cap_mb: Callable[[], int]):
        self.cap_mb = cap_mb
        in_memory = str(database) == ":memory:"
        self.states = None if in_memory else SavedStates(Path(database).parent / FOLDER)

    def attach(self, session: ChatSession, conversation_id: int) -> None:
        """Engine thread, before an answer: `session` serves conversation `conversation_id`."""
        if self.states is None or self.cap_mb() == 0:
            session.saved = None
            return
        key = conversation_key(conversation_id)
        if session.saved is not None and session.saved.key == key:
            return
        try:
            identity = identity_of(session.loaded.path, session.loaded.model)
        except OSError as exc:  # the model file went away after loading: nothing to check a state against
            log.warning("conversation states are not saved: the model file cannot be read (%s)", exc)
            session.saved = None
            return
        session.saved = ConversationState(self.states, key, identity)

    def leave(self, session: ChatSession | None, worker: Worker) -> None:
        """GUI thread, on leaving a conversation: save what `session` holds of it on the engine thread."""
        if session is not None and session.saved is not None:
            worker.submit(Job(lambda cancel: self.save_now(session), "save state"))

    def save_now(self, session: ChatSession | None) -> None:
        """Save what `session` holds of its conversation, here and now (the engine thread, or
        any thread once it has stopped), within the cap."""
        if session is None or self.states is None:
            return
        self.states.cap_bytes = self.cap_mb() << 20
        session.save_state()

    def discard(self, conversation_id: int, session: ChatSession | None) -> None:
        """Delete a deleted conversation's saved state; `session`, if it serves it, saves it no more."""
        key = conversation_key(conversation_id)
        if session is not None and session.saved is not None and session.saved.key == key:
            session.saved = None
        if self.states is not None:
            self.states.discard(key)
