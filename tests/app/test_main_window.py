"""The whole window on the real bundled model, offscreen: chatting, stopping, editing,
models coming and going, settings, restarts, responsiveness."""

import time
from dataclasses import replace
from pathlib import Path

import pytest

from PySide6.QtCore import QMimeData, QPointF, Qt, QTimer, QUrl
from PySide6.QtGui import QDropEvent

from engine.bundled import bundled_model
from tests.gguf_factory import write_tiny_model
from tests.app.conftest import (
    ANSWER_TIMEOUT_MS, LOAD_TIMEOUT_MS, answer, close_window, load, make_window, quick_settings,
)

TINY_QWEN3 = "tests/fixtures/models/tiny-qwen3-f32.gguf"


def stored(window):
    """The open conversation's messages, from the database."""
    return window.store.messages(window.controller.conversation.id)


def test_opens_ready_on_the_default_model(window):
    assert window.model_bar.model_button.full_text() == window.controller.model_info.name
    assert "SmolLM2" in window.controller.model_info.name
    assert window.model_bar.backend_label.text().startswith("cpu")  # the native kernels, and no warning sign
    assert window.send_button.text() == "Send"


def test_enter_sends_and_the_answer_streams(qtbot, window):
    window.input.setPlainText("What is the capital of France?")
    texts: list[str] = []
    window.controller.answer_text.connect(texts.append)
    with qtbot.waitSignal(window.controller.answer_finished, timeout=ANSWER_TIMEOUT_MS) as finished:
        qtbot.keyClick(window.input, Qt.Key.Key_Return)
    metrics, state = finished.args
    assert state == "complete"
    assert window.input.toPlainText() == ""  # Enter sent and cleared the box
    assert len(texts) >= 2  # streamed in several updates, each extending the last
    assert all(b.startswith(a) for a, b in zip(texts, texts[1:]))
    messages = stored(window)
    assert [m.role for m in messages] == ["user", "assistant"]
    assert messages[1].content == texts[-1] and "Paris" in messages[1].content
    assert messages[1].state == "complete" and messages[1].metrics["decode_tokens"] == metrics["decode_tokens"]
    assert messages[1].model == window.controller.model_info.name
    assert window.chat_view.message_texts()[-1] == texts[-1]


def test_shift_enter_adds_a_newline(qtbot, window):
    qtbot.keyClicks(window.input, "first")
    qtbot.keyClick(window.input, Qt.Key.Key_Return, Qt.KeyboardModifier.ShiftModifier)
    qtbot.keyClicks(window.input, "second")
    assert window.input.toPlainText() == "first\nsecond"
    assert window.controller.conversation is None  # nothing was sent


def test_stop_ends_the_answer_early_and_keeps_it(qtbot, window):
    window.apply_settings(replace(window.controller.settings, max_tokens=400))
    window.input.setPlainText("Write a very long story about a dragon.")
    with qtbot.waitSignal(window.controller.answer_text, timeout=ANSWER_TIMEOUT_MS):
        window.send_button.click()
    assert window.send_button.text() == "Stop"
    with qtbot.waitSignal(window.controller.answer_finished, timeout=ANSWER_TIMEOUT_MS) as finished:
        window.send_button.click()
    metrics, state = finished.args
    assert state == "cancelled"
    assert metrics["decode_tokens"] < 400
    assert stored(window)[-1].state == "cancelled" and stored(window)[-1].content
    assert window.send_button.text() == "Send"


def test_regenerate_replaces_the_last_answer_and_reuses_the_cache(qtbot, window):
    answer(qtbot, window, lambda: window.controller.send("Name a colour."))
    first = stored(window)
    window.apply_settings(replace(window.controller.settings, temperature=1.0, seed=7))
    metrics, state = answer(qtbot, window, window.controller.regenerate)
    second = stored(window)
    assert [m.role for m in second] == ["user", "assistant"]
    assert second[0] == first[0]
    assert second[1].content != first[1].content
    assert [v["content"] for v in second[1].all_versions()] == [first[1].content, second[1].content]
    assert metrics["prefill_tokens"] <= 1  # the prompt was still in the KV cache
    assert len(window.chat_view.message_texts()) == 2


def test_edit_reruns_from_the_edited_message(qtbot, window):
    answer(qtbot, window, lambda: window.controller.send("What is the capital of France?"))
    answer(qtbot, window, lambda: window.controller.send("And of Germany?"))
    assert len(stored(window)) == 4
    with qtbot.waitSignal(window.controller.answer_finished, timeout=ANSWER_TIMEOUT_MS) as finished:
        window.chat_view.edit_submitted.emit(0, "What is the capital of Italy?")
    metrics, _state = finished.args
    messages = stored(window)
    assert [m.role for m in messages] == ["user", "assistant"]
    assert messages[0].content == "What is the capital of Italy?"
    assert messages[1].content and messages[1].state == "complete"
    # Only the tokens after the shared prefix (system prompt, template) were prefilled.
    assert 0 < metrics["prefill_tokens"] < metrics["context_used"]
    assert window.chat_view.message_texts() == [m.content for m in messages]


def drop_file(window, path) -> None:
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(path))])
    event = QDropEvent(QPointF(50, 50), Qt.DropAction.CopyAction, mime, Qt.MouseButton.NoButton,
                       Qt.KeyboardModifier.NoModifier)
    window.dropEvent(event)


def test_dropping_a_valid_model_loads_it_and_adds_it_to_the_library(qtbot, window):
    with qtbot.waitSignal(window.controller.models.model_loaded, timeout=LOAD_TIMEOUT_MS) as loaded:
        drop_file(window, TINY_QWEN3)
    assert loaded.args[0].architecture == "qwen3"
    assert window.controller.loaded.path.name == "tiny-qwen3-f32.gguf"
    assert any(m.path.endswith("tiny-qwen3-f32.gguf") for m in window.store.models())
    assert "qwen3" in window.model_bar.details.text()


def test_dropping_invalid_files_explains_and_keeps_the_app_usable(qtbot, window, tmp_path):
    text_file = tmp_path / "notes.txt"
    text_file.write_text("hello")
    drop_file(window, text_file)
    assert "notes.txt is not a GGUF model file" in window.error_banner.text()
    assert window.controller.loaded is not None  # the loaded model is untouched

    corrupt = tmp_path / "broken.gguf"
    corrupt.write_bytes(b"GGUF" + b"\x03\x00\x00\x00" + b"\xff" * 64)
    with qtbot.waitSignal(window.controller.error, timeout=LOAD_TIMEOUT_MS) as error:
        drop_file(window, corrupt)
    assert "broken.gguf" in error.args[0]
    qtbot.waitUntil(lambda: not window.controller.busy, timeout=LOAD_TIMEOUT_MS)
    assert window.error_banner.text() == error.args[0]  # the engine's message, intact
    assert window.controller.loaded.path.name == "SmolLM2-135M-Instruct.Q4_1.gguf"  # still loaded
    assert window.model_bar.model_button.full_text() == window.controller.model_info.name
    _metrics, state = answer(qtbot, window, lambda: window.controller.send("Hi"))
    assert state == "complete"


def test_a_moved_model_file_gets_a_clear_message(qtbot, window, tmp_path):
    missing = tmp_path / "gone.gguf"
    window.add_model(str(missing))
    assert "gone.gguf" in window.error_banner.text() and "moved or deleted" in window.error_banner.text()
    window.store.add_model(str(missing), "Gone")
    picker = window.open_model_picker()
    picker.wait_for_headers()
    row = [e.path for e in picker._entries].index(missing)
    assert "File not found" in picker.info(row)
    picker.close()


def test_conversations_survive_a_restart(qtbot, tmp_path):
    data = tmp_path / "data"
    first = make_window(qtbot, data, quick_settings(tmp_path))
    load(qtbot, first, bundled_model("smollm2").path)
    answer(qtbot, first, lambda: first.controller.send("What is the capital of France?"))
    conversation = first.controller.conversation
    before = [(m.role, m.content, m.metrics) for m in stored(first)]
    close_window(first)

    second = make_window(qtbot, data, quick_settings(tmp_path))
    try:
        assert second.sidebar.ids() == [conversation.id]
        second.controller.open_conversation(conversation.id)
        assert [(m.role, m.content, m.metrics) for m in stored(second)] == before
        assert second.chat_view.message_texts() == [content for _role, content, _m in before]
    finally:
        close_window(second)


@pytest.mark.any_model
def test_search_finds_conversations_by_title_and_content(qtbot, window):
    answer(qtbot, window, lambda: window.controller.send("What is the capital of France?"))
    other = window.store.create_conversation("Shopping list")
    window.store.add_message(other.id, "user", "buy avocados")
    for query, expected in (("shopping", [other.id]), ("avocado", [other.id]),
                            ("capital of france", [window.controller.conversation.id])):
        window.sidebar.search.setText(query)
        qtbot.waitUntil(lambda expected=expected: window.sidebar.ids() == expected, timeout=5000)


@pytest.mark.any_model
def test_settings_apply_and_persist(qtbot, window):
    window.apply_settings(replace(window.controller.settings, max_tokens=5, theme="dark"))
    metrics, state = answer(qtbot, window, lambda: window.controller.send("Tell me about the sea."))
    assert metrics["decode_tokens"] == 5 and state == "complete"
    assert stored(window)[-1].content
    from app.settings import load_settings
    saved, warnings = load_settings(window.settings_path)
    assert saved.max_tokens == 5 and saved.theme == "dark" and not warnings
    assert window.palette().window().color().lightness() < 80  # the dark theme is in use


def test_a_context_change_made_while_answering_applies_when_the_answer_ends(qtbot, window):
    window.apply_settings(replace(window.controller.settings, max_tokens=64))
    before = window.controller.settings.context_length
    with qtbot.waitSignal(window.controller.answer_finished, timeout=ANSWER_TIMEOUT_MS) as finished:
        window.controller.send("Tell me about the sea.")
        qtbot.waitSignal(window.controller.answer_text, timeout=ANSWER_TIMEOUT_MS).wait()
        window.apply_settings(replace(window.controller.settings, context_length=512))
    assert finished.args[0]["context_size"] == before != 512  # the running answer kept its context
    qtbot.waitUntil(lambda: not window.controller.busy, timeout=LOAD_TIMEOUT_MS)
    metrics, state = answer(qtbot, window, lambda: window.controller.send("And about the mountains?"))
    assert state == "complete" and metrics["context_size"] == 512


@pytest.mark.any_model
def test_per_conversation_overrides_win_over_the_settings(qtbot, window):
    answer(qtbot, window, lambda: window.controller.send("Hello"))
    window.controller.set_overrides({"max_tokens": 3})
    metrics, _state = answer(qtbot, window, lambda: window.controller.send("Tell me about the sea."))
    assert metrics["decode_tokens"] == 3
    assert window.store.conversation(window.controller.conversation.id).overrides == {"max_tokens": 3}


@pytest.mark.any_model
def test_context_overflow_shows_the_engines_notice(qtbot, window):
    window.apply_settings(replace(window.controller.settings, context_length=256, max_tokens=16))
    qtbot.waitUntil(lambda: not window.controller.busy, timeout=LOAD_TIMEOUT_MS)
    notices: list[str] = []
    window.controller.notice.connect(notices.append)
    for i in range(6):
        answer(qtbot, window, lambda i=i: window.controller.send(f"Question {i}: " + "tell me more " * 12))
    assert len([n for n in notices if "oldest messages were left out" in n]) == 1  # told once, not every turn
    assert window.info_banner.isVisible() and "left out" in window.info_banner.text()
    assert len(stored(window)) == 12  # nothing is deleted from the conversation itself


@pytest.mark.any_model
def test_a_message_longer_than_the_context_is_an_error_not_a_crash(qtbot, window):
    window.apply_settings(replace(window.controller.settings, context_length=256))
    qtbot.waitUntil(lambda: not window.controller.busy, timeout=LOAD_TIMEOUT_MS)
    with qtbot.waitSignal(window.controller.error, timeout=ANSWER_TIMEOUT_MS) as error:
        window.controller.send("word " * 400)
    assert "too long for the context" in error.args[0]
    qtbot.waitUntil(lambda: not window.controller.busy, timeout=ANSWER_TIMEOUT_MS)
    assert window.error_banner.text() == error.args[0]
    assert stored(window)[-1].state == "error"
    window.apply_settings(replace(window.controller.settings, context_length=2048))
    qtbot.waitUntil(lambda: not window.controller.busy, timeout=LOAD_TIMEOUT_MS)
    _metrics, state = answer(qtbot, window, lambda: window.controller.send("Hi"))
    assert state == "complete"


def test_a_model_too_large_for_memory_is_refused_with_a_message(qtbot, window, monkeypatch):
    import engine.opening
    with qtbot.waitSignal(window.controller.models.model_unloaded, timeout=LOAD_TIMEOUT_MS):
        window.controller.models.unload()  # otherwise its own memory would count as available
    monkeypatch.setattr(engine.opening, "available_memory", lambda: 50_000_000)  # 50 MB free
    with qtbot.waitSignal(window.controller.error, timeout=LOAD_TIMEOUT_MS) as error:
        window.add_model(str(bundled_model("smollm2").path))
    assert "will not fit" in error.args[0] and "available" in error.args[0]
    qtbot.waitUntil(lambda: not window.controller.busy, timeout=LOAD_TIMEOUT_MS)
    assert window.send_button.isEnabled()


def test_loading_can_be_cancelled(qtbot, window):
    with qtbot.waitSignal(window.controller.models.load_progress, timeout=LOAD_TIMEOUT_MS):
        window.add_model(str(bundled_model("gemma3").path))
    assert window.model_bar.progress.isVisible()
    previous = window.controller.model_info
    with qtbot.waitSignal(window.controller.models.model_loaded, timeout=LOAD_TIMEOUT_MS) as kept:
        window.model_bar.cancel_button.click()
    assert "cancelled" in window.info_banner.text() and not window.error_banner.isVisible()
    assert kept.args == [previous]  # the model in use stayed (issue 28)
    assert window.controller.loaded is not None and not window.model_bar.progress.isVisible()


def test_load_reports_reach_listeners_on_the_gui_thread(qtbot, window, monkeypatch):
    """Progress and notices from a load on the engine thread are emitted on the GUI thread,
    so any listener (a widget, a lambda, a test's signal spy) is safe."""
    import threading
    import engine.opening
    from engine.model_info import read_model_info
    with qtbot.waitSignal(window.controller.models.model_unloaded, timeout=LOAD_TIMEOUT_MS):
        window.controller.models.unload()
    # NumPy's float32 copy is what can make a load "run, but slowly" (the notice heard below)
    window.controller.apply_settings(replace(window.controller.settings, backend="numpy"))
    info = read_model_info(TINY_QWEN3)
    n_ctx = window.controller.settings.context_length
    fits_uncached = max(info.file_size, info.weight_bytes_f32) + info.kv_bytes_per_token * min(n_ctx, info.context_length)
    monkeypatch.setattr(engine.opening, "available_memory", lambda: fits_uncached)  # runs, but slowly
    threads: list[tuple[str, bool]] = []

    def record(name):
        return lambda *_args: threads.append((name, threading.current_thread() is threading.main_thread()))

    direct = Qt.ConnectionType.DirectConnection  # runs in whichever thread emits
    window.controller.models.load_progress.connect(record("progress"), direct)
    window.controller.model_notice.connect(record("notice"), direct)
    with qtbot.waitSignal(window.controller.models.model_loaded, timeout=LOAD_TIMEOUT_MS):
        window.controller.models.load(TINY_QWEN3)
    names = {name for name, _ in threads}
    assert names == {"progress", "notice"}  # both kinds were heard
    assert all(on_gui_thread for _, on_gui_thread in threads)
    assert "slowly" in window.info_banner.text()


def test_unload_releases_the_model(qtbot, window):
    with qtbot.waitSignal(window.controller.models.model_unloaded, timeout=LOAD_TIMEOUT_MS):
        window.model_bar.unload_button.click()
    assert window.controller.loaded is None
    assert window.controller.send("Hi") is False
    assert "No model is loaded" in window.error_banner.text()


def test_the_event_loop_never_stalls_while_generating(qtbot, window):
    """The longest gap between timer ticks on the GUI thread stays under 100 ms."""
    window.apply_settings(replace(window.controller.settings, max_tokens=96))
    gaps: list[float] = []
    last = [time.perf_counter()]

    def tick() -> None:
        now = time.perf_counter()
        gaps.append(now - last[0])
        last[0] = now

    timer = QTimer()
    timer.setInterval(5)
    timer.timeout.connect(tick)
    with qtbot.waitSignal(window.controller.answer_finished, timeout=ANSWER_TIMEOUT_MS) as finished:
        timer.start()
        last[0] = time.perf_counter()
        window.controller.send("Write a long story about a dragon who learns to cook.")
    timer.stop()
    metrics, _state = finished.args
    assert metrics["decode_tokens"] >= 48  # the measurement covered a real stream
    print(f"\nlongest event-loop stall while generating {metrics['decode_tokens']} tokens: "
          f"{max(gaps) * 1000:.1f} ms over {len(gaps)} ticks")
    assert max(gaps) < 0.100


@pytest.mark.any_model
def test_rename_and_delete_conversations(qtbot, window):
    answer(qtbot, window, lambda: window.controller.send("Hello there"))
    conversation_id = window.controller.conversation.id
    window.sidebar.rename_requested.emit(conversation_id, "Greetings")
    assert window.store.conversation(conversation_id).title == "Greetings"
    assert window.sidebar.list.item(0).text().startswith("Greetings")
    window.sidebar.delete_requested.emit(conversation_id)
    assert window.store.conversations() == [] and window.sidebar.ids() == []
    assert window.controller.conversation is None and not window.chat_view.has_messages()


def test_the_backend_can_be_chosen_in_the_settings(qtbot, window):
    pytest.importorskip("mlx.core", reason="the mlx package is not installed, so MLX cannot be chosen")
    with qtbot.waitSignal(window.controller.models.model_loaded, timeout=LOAD_TIMEOUT_MS):
        window.apply_settings(replace(window.controller.settings, backend="mlx"))
    assert window.controller.loaded.backend.name == "mlx"
    assert window.model_bar.backend_label.text().startswith("mlx")
    _metrics, state = answer(qtbot, window, lambda: window.controller.send("What is the capital of France?"))
    assert state == "complete" and "Paris" in stored(window)[-1].content


def test_a_model_named_on_the_command_line_is_opened_first(tmp_path):
    from app.main import model_to_open
    last = write_tiny_model(tmp_path / "last.gguf")
    assert model_to_open("/models/asked.gguf", str(last)) == Path("/models/asked.gguf")
    assert model_to_open(None, str(last)) == last
    assert model_to_open(None, str(tmp_path / "deleted.gguf")) == bundled_model("smollm2").path


def test_a_type_converted_at_load_is_told(qtbot, window, tmp_path):
    from gguf import GGMLQuantizationType

    from tests.engine.test_cpu_backend_loading import nvfp4_blocks  # NVFP4: no cpu kernel
    path = write_tiny_model(tmp_path / "nvfp4.gguf", arch="qwen3", d_model=256, n_heads=4, head_dim=64, d_ff=256,
                            tensor_type=GGMLQuantizationType.NVFP4, quantize=nvfp4_blocks)
    notices: list[str] = []
    window.controller.model_notice.connect(notices.append)
    with qtbot.waitSignal(window.controller.models.model_loaded, timeout=LOAD_TIMEOUT_MS):
        window.controller.models.load(path)
    assert any("is NVFP4" in n and "converted to Q8_0 at load" in n for n in notices), notices
