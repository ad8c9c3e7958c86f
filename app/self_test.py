"""`sprig --self-test`: prove an installed (or packaged) Sprig works, without a screen.

It checks, in order: that Qt can build the whole window offscreen (plugins, styles,
resources), that the chats database works in WAL mode, that the local server's HTTP stack
starts on loopback and answers (503 "loading", as it does before a model is served), and
that the bundled default model loads and answers a question it knows, greedily, with
"Paris". It prints one line per check and returns 0 only if all pass.
"""

import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

QUESTION = "What is the capital of France?"
EXPECTED = "Paris"


def check_window(folder: Path) -> str:
    """Build the main window offscreen with a fresh store and settings."""
    from PySide6.QtWidgets import QApplication

    from app.main_window import MainWindow
    from app.settings import Settings
    from app.storage import Store

    existing = QApplication.instance()
    app = existing if isinstance(existing, QApplication) else QApplication(["sprig-self-test"])
    store = Store(folder / "window.sqlite3")
    window = MainWindow(store, Settings.defaults(), folder / "settings.json")
    window.controller.shutdown()
    window.deleteLater()
    app.processEvents()
    store.close()
    return f"Qt {app.platformName()} platform, window built"


def check_store(folder: Path) -> str:
    """Write and read back a message in a WAL-mode database."""
    from app.storage import Store

    store = Store(folder / "check.sqlite3")
    conversation = store.create_conversation("self-test")
    store.add_message(conversation.id, "user", QUESTION)
    mode = store.journal_mode
    store.close()
    reopened = Store(folder / "check.sqlite3")
    content = reopened.messages(conversation.id)[0].content
    reopened.close()
    if content != QUESTION or mode != "wal":
        raise AssertionError(f"database round trip gave {content!r} in {mode} mode")
    return "SQLite WAL round trip"


def check_server() -> str:
    """Start the local server on a free loopback port with no model; /health must say 503."""
    import urllib.error
    import urllib.request

    from engine.server.app import ServerConfig, ServerState
    from engine.server.serve import BackgroundServer

    server = BackgroundServer(ServerState(), ServerConfig(port=0)).start()
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{server.port}/health", timeout=10)
    except urllib.error.HTTPError as error:  # the answer expected: no model is served yet
        if error.code != 503:
            raise AssertionError(f"/health answered {error.code}, expected 503 with no model") from error
        return f"HTTP server answered on 127.0.0.1:{server.port}"
    finally:
        server.stop()
    raise AssertionError("/health answered 200 with no model")


def check_model() -> str:
    """Load the default model and ask it a question it answers reliably."""
    from engine.bundled import default_model
    from engine.opening import OpenSettings, open_model
    from engine.sampling import SamplingParams

    started = time.perf_counter()
    opened = open_model(default_model().path, OpenSettings(speculative="off"))
    loaded = opened.local
    load_s = time.perf_counter() - started
    try:
        session = opened.new_session(max_tokens=24, params=SamplingParams.greedy())
        events = list(session.send(QUESTION))
    finally:
        opened.close()
    answer = "".join(e.text for e in events).strip()
    if EXPECTED not in answer:
        raise AssertionError(f"the model answered {answer!r}, expected it to mention {EXPECTED}")
    metrics = events[-1].metrics
    return (
        f"{loaded.path.name} on {loaded.backend.name} ({loaded.backend.device_name}): loaded in {load_s:.1f} s, "
        f"answered {answer!r} at {metrics.decode_tokens_per_second or 0:.1f} tok/s ({events[-1].finish_reason})"
    )


def run_self_test() -> int:
    """Run every check; print one line each; 0 if all passed, 1 otherwise."""
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    failures = 0
    with tempfile.TemporaryDirectory(prefix="sprig-self-test-") as tmp:
        checks: list[tuple[str, Callable[[], str]]] = [
            ("window", lambda: check_window(Path(tmp))),
            ("storage", lambda: check_store(Path(tmp))),
            ("server", check_server),
            ("model", check_model),
        ]
        for name, check in checks:
            try:
                print(f"ok    {name}: {check()}", flush=True)
            except Exception as exc:  # report every failure, keep checking
                failures += 1
                print(f"FAIL  {name}: {type(exc).__name__}: {exc}", flush=True)
    print("self-test passed" if not failures else f"self-test failed ({failures} of {len(checks)} checks)")
    return 1 if failures else 0
