"""Issue 10, the app for a first-time user: what the window says and does, offscreen."""

import json
from dataclasses import replace

import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QKeySequence
from PySide6.QtWidgets import (
    QAbstractButton, QApplication, QCheckBox, QLabel, QLineEdit, QListWidget, QPlainTextEdit, QProgressBar, QWidget,
)

from app.transcript import import_json, to_json, to_markdown
from engine.bundled import bundled_model
from tests.app.conftest import ANSWER_TIMEOUT_MS, LOAD_TIMEOUT_MS, answer, close_window, load, make_window, quick_settings
from tests.gguf_factory import write_tiny_model


def test_a_guessed_template_and_a_base_model_are_told_once_and_cleared(qtbot, tmp_path):
    bare = write_tiny_model(tmp_path / "tiny-qwen3-base.gguf", "qwen3", **{"tokenizer.chat_template": None})
    window = make_window(qtbot, tmp_path / "data", quick_settings(tmp_path))
    try:
        notices: list[str] = []
        window.controller.model_notice.connect(notices.append)
        load(qtbot, window, bare)
        qtbot.waitUntil(lambda: len(notices) >= 1)
        text = window.info_banner.text()
        assert window.info_banner.isVisible()
        assert "no chat template" in text and "ChatML" in text and "base model" in text
        assert len([n for n in notices if "no chat template" in n]) == 1
        # A model with its own template: the notice about the last one goes away.
        load(qtbot, window, bundled_model("smollm2").path)
        assert not window.info_banner.isVisible()
    finally:
        close_window(window)


def inside_window(window, widget) -> bool:
    """Whether `widget` is shown, with some size, wholly within the window's area."""
    top_left = widget.mapTo(window, widget.rect().topLeft())
    area = widget.rect().translated(top_left)
    return widget.isVisible() and area.width() > 5 and area.height() > 5 and window.rect().contains(area)


def test_the_window_fits_a_laptop_screen(qtbot, window):
    long_name = "Very-Long-Model-Name-Instruct-v0.3-With-Many-Parts-" * 4
    info = replace(window.controller.model_info, name=long_name)
    for width, height in ((1366, 768), (1280, 720)):
        window.resize(width, height)
        qtbot.wait(50)
        window.model_bar.set_model(info)
        window.controller.models.backend_changed.emit("numpy", "CPU, " + "a long device description " * 6, [])
        window.model_bar.set_loading(True)
        qtbot.wait(50)
        assert window.size().width() == width and window.size().height() == height  # nothing grew it
        window.model_bar.set_loading(False)
        qtbot.wait(50)
        hint = window.minimumSizeHint()
        assert hint.width() <= 1000 and hint.height() <= 600
        assert window.size().width() == width and window.size().height() == height
        for widget in (window.input, window.send_button, window.metrics, window.metrics.rate,
                       window.model_bar.model_button):
            assert inside_window(window, widget), widget
        # The long texts are cut short, and whole in their tooltips.
        button = window.model_bar.model_button
        assert "…" in button.text() and long_name in button.toolTip()
        assert window.model_bar.details.text() in window.model_bar.details.toolTip()
        assert window.model_bar.backend_label.is_elided()


def visible_texts(window) -> list[str]:
    """The texts of every label and button the user can see."""
    widgets = window.findChildren(QLabel) + window.findChildren(QAbstractButton)
    return [w.text() for w in widgets if w.isVisible()]


def test_loading_tells_one_story_and_cancel_is_not_an_error(qtbot, tmp_path):
    window = make_window(qtbot, tmp_path / "data", quick_settings(tmp_path))
    try:
        gemma = bundled_model("gemma3").path
        with qtbot.waitSignal(window.controller.models.load_progress, timeout=LOAD_TIMEOUT_MS,
                              check_params_cb=lambda fraction, _stage: fraction > 0.2):
            window.add_model(str(gemma))
        bar = window.model_bar.progress
        centre = window.chat_view.placeholder.text()
        assert window.chat_view.placeholder.isVisible()
        assert gemma.name in centre and f"{round(100 * bar.value() / bar.maximum())}%" in centre
        assert not [text for text in visible_texts(window) if "No model loaded" in text]
        assert bar.alignment() & Qt.AlignmentFlag.AlignHCenter  # the percentage sits inside the bar
        assert not window.model_bar.unload_button.isEnabled()
        with qtbot.waitSignal(window.controller.models.model_unloaded, timeout=LOAD_TIMEOUT_MS):
            window.model_bar.cancel_button.click()
        assert not window.error_banner.isVisible()
        assert window.info_banner.isVisible() and "cancelled" in window.info_banner.text()
    finally:
        close_window(window)


def test_loading_over_a_chat_says_so_above_it(qtbot, window):
    answer(qtbot, window, lambda: window.controller.send("Hi"))
    with qtbot.waitSignal(window.controller.models.load_progress, timeout=LOAD_TIMEOUT_MS,
                          check_params_cb=lambda fraction, _stage: fraction > 0.2):
        window.add_model(str(bundled_model("gemma3").path))
    assert window.loading_label.isVisible() and "gemma-3-270m" in window.loading_label.text()
    with qtbot.waitSignal(window.controller.models.model_loaded, timeout=LOAD_TIMEOUT_MS):  # the model in use stays
        window.controller.cancel()
    assert not window.loading_label.isVisible()


def test_backend_notes_warn_only_when_a_gpu_idles(qtbot, window):
    reasons = list(window.controller.loaded.backend_notes)
    assert reasons  # the other backends' stories are there to tell
    window._gpu = None  # a PC without a GPU
    window.controller.models.backend_changed.emit("numpy", "CPU", reasons)
    label = window.model_bar.backend_label
    assert "⚠" not in label.text() and not label.property("warning")
    assert all(reason in label.toolTip() for reason in reasons)
    assert window.metrics.notes.isHidden()
    window._gpu = "an NVIDIA GPU"
    window.controller.models.backend_changed.emit("numpy", "CPU", reasons)
    assert label.text().startswith("⚠") and label.property("warning")
    assert "NVIDIA GPU" in label.toolTip() and not window.metrics.notes.isHidden()


def stored(window):
    """The open conversation's messages, from the database."""
    return window.store.messages(window.controller.conversation.id)


@pytest.mark.any_model
def test_regenerated_answers_are_versions_stored_exported_and_kept_over_a_restart(qtbot, tmp_path, window):
    answer(qtbot, window, lambda: window.controller.send("Name a colour."))
    first = stored(window)[-1].content
    window.apply_settings(replace(window.controller.settings, temperature=1.0, seed=7))
    answer(qtbot, window, window.controller.regenerate)
    last = stored(window)[-1]
    assert last.content != first and [v["content"] for v in last.all_versions()] == [first, last.content]
    card = window.chat_view._messages[-1]
    assert card.version_label.isVisible() and card.version_label.text() == "2/2"
    card.previous_button.click()
    assert stored(window)[-1].content == first
    card = window.chat_view._messages[-1]
    assert card.version_label.text() == "1/2" and card.content() == first
    assert not card.previous_button.isEnabled() and card.next_button.isEnabled()
    # Exported and imported with both versions.
    conversation = window.controller.conversation
    exported = to_json(conversation, stored(window))
    assert [v["content"] for v in exported["messages"][-1]["versions"]] == [last.content]
    assert "version 1 of 2" in to_markdown(conversation, stored(window))
    imported = import_json(window.store, json.loads(json.dumps(exported)))
    copy = window.store.messages(imported.id)[-1]
    assert [v["content"] for v in copy.all_versions()] == [first, last.content] and copy.active == 0
    # A restart keeps them.
    data_dir = window.settings_path.parent
    close_window(window)
    again = make_window(qtbot, data_dir, quick_settings(tmp_path))
    try:
        again.controller.open_conversation(conversation.id)
        card = again.chat_view._messages[-1]
        assert card.version_label.text() == "1/2" and card.content() == first
    finally:
        close_window(again)


def test_an_answer_cut_by_the_token_limit_says_so_and_continues(qtbot, window):
    window.apply_settings(replace(window.controller.settings, max_tokens=12))
    metrics, state = answer(qtbot, window, lambda: window.controller.send("Write a long story about a dragon."))
    assert state == "complete" and metrics["decode_tokens"] == 12
    card = window.chat_view._messages[-1]
    assert card.note.isVisible() and "token limit" in card.note.text()
    assert card.continue_button.isVisible()
    before = stored(window)[-1]
    metrics, state = answer(qtbot, window, card.continue_button.click)
    after = stored(window)[-1]
    assert after.id == before.id and after.content.startswith(before.content) and len(after.content) > len(before.content)
    assert metrics["prefill_tokens"] <= 2  # the answer so far was still in the KV cache


def test_continue_after_stop(qtbot, window):
    window.apply_settings(replace(window.controller.settings, max_tokens=200))
    with qtbot.waitSignal(window.controller.answer_text, timeout=ANSWER_TIMEOUT_MS):
        window.controller.send("Write a very long story about a dragon.")
    with qtbot.waitSignal(window.controller.answer_finished, timeout=ANSWER_TIMEOUT_MS):
        window.controller.cancel()
    stopped = stored(window)[-1]
    assert stopped.state == "cancelled" and window.chat_view._messages[-1].continue_button.isVisible()
    window.apply_settings(replace(window.controller.settings, max_tokens=8))
    _metrics, state = answer(qtbot, window, lambda: window.menu_actions["continue"].trigger())
    assert state == "complete" and stored(window)[-1].content.startswith(stopped.content)
    assert len(stored(window)) == 2


def test_error_banners_clear_when_their_cause_is_gone(qtbot, window, tmp_path, monkeypatch):
    import app.main_window
    window.add_model(str(tmp_path / "notes.txt"))
    assert window.error_banner.isVisible()
    load(qtbot, window, bundled_model("smollm2").path)
    assert not window.error_banner.isVisible()
    bad, good = tmp_path / "bad.json", tmp_path / "good.json"
    bad.write_text("{not json", encoding="utf-8")
    answer(qtbot, window, lambda: window.controller.send("Hi"))
    good.write_text(json.dumps(to_json(window.controller.conversation, stored(window))), encoding="utf-8")
    for path, shown in ((bad, True), (good, False)):
        monkeypatch.setattr(app.main_window.QFileDialog, "getOpenFileName", lambda *_a, p=path: (str(p), ""))
        window.import_conversation()
        assert window.error_banner.isVisible() is shown


def test_the_menu_bar_has_quit_about_and_a_shortcuts_sheet(qtbot, window):
    from app.menu_bar import shortcuts_text, show_shortcuts
    menus = [action.text().replace("&", "") for action in window.menuBar().actions()]
    assert menus == ["File", "Model", "Chat", "View", "Help"]
    assert window.menu_actions["quit"].shortcut().toString() == "Ctrl+Q"
    assert window.menu_actions["shortcuts"].shortcut().toString() == "F1"
    sheet = shortcuts_text(window.menu_actions)
    for name in ("quit", "new", "choose_model", "continue", "stop", "settings"):
        assert window.menu_actions[name].shortcut().toString(QKeySequence.SequenceFormat.NativeText) in sheet
    box = show_shortcuts(window, window.menu_actions)
    assert box.isVisible() and "Quit" in box.text()
    box.close()
    # The View menu and the bar's Metrics button fold the panel together.
    window.menu_actions["metrics"].trigger()
    assert window.metrics.isHidden() and not window.model_bar.metrics_button.isChecked()
    window.model_bar.metrics_button.click()
    assert not window.metrics.isHidden() and window.menu_actions["metrics"].isChecked()
    window.menu_actions["quit"].trigger()
    assert not window.isVisible()


def current_id(window):
    item = window.sidebar.list.currentItem()
    return item.data(Qt.ItemDataRole.UserRole) if item is not None and item.isSelected() else None


def test_rename_inline_with_f2_or_a_double_click(qtbot, window):
    answer(qtbot, window, lambda: window.controller.send("Hello there"))
    conversation_id = window.controller.conversation.id
    window.sidebar.list.setFocus()
    qtbot.keyClick(window.sidebar.list, Qt.Key.Key_F2)
    editor = window.sidebar._editor
    assert editor is not None and editor.isVisible() and editor.text() == "Hello there"
    editor.setText("Greetings")
    qtbot.keyClick(editor, Qt.Key.Key_Return)
    assert window.store.conversation(conversation_id).title == "Greetings"
    assert window.windowTitle().startswith("Greetings")
    window.sidebar.list.itemDoubleClicked.emit(window.sidebar.list.item(0))
    editor = window.sidebar._editor
    editor.setText("Not kept")
    qtbot.keyClick(editor, Qt.Key.Key_Escape)
    assert window.store.conversation(conversation_id).title == "Greetings" and window.sidebar._editor is None


def test_search_results_show_the_matching_snippet(qtbot, window):
    answer(qtbot, window, lambda: window.controller.send("What is the capital of France?"))
    word = next(w for w in stored(window)[-1].content.split() if len(w) > 5 and w.isalpha())
    window.sidebar.search.setText(word)
    window.refresh_conversations()
    second_line = window.sidebar.list.item(0).text().split("\n")[1]
    assert word.casefold() in second_line.casefold() and "ago" not in second_line


@pytest.mark.any_model
def test_a_restart_reopens_the_last_conversation_highlighted(qtbot, tmp_path, window):
    answer(qtbot, window, lambda: window.controller.send("First chat"))
    first = window.controller.conversation.id
    window.new_conversation()
    assert current_id(window) is None  # a fresh chat: nothing highlighted
    answer(qtbot, window, lambda: window.controller.send("Second chat"))
    assert current_id(window) == window.controller.conversation.id
    window.sidebar.list.itemClicked.emit(window.sidebar.list.item(1))
    assert window.controller.conversation.id == first and current_id(window) == first
    data_dir = window.settings_path.parent
    close_window(window)
    from app.settings import load_settings
    settings, _warnings = load_settings(data_dir / "settings.json")
    again = make_window(qtbot, data_dir, settings)
    try:
        assert again.controller.conversation.id == first and current_id(again) == first
        assert again.chat_view.message_texts()[0] == "First chat" and again.windowTitle().startswith("First chat")
    finally:
        close_window(again)


def test_the_highlight_stays_on_the_open_chat_when_switching_is_refused(qtbot, window):
    answer(qtbot, window, lambda: window.controller.send("One"))
    window.new_conversation()
    window.apply_settings(replace(window.controller.settings, max_tokens=200))
    with qtbot.waitSignal(window.controller.answer_text, timeout=ANSWER_TIMEOUT_MS):
        window.controller.send("Write a very long story.")
    open_id = window.controller.conversation.id
    other = window.sidebar.list.item(1)
    window.sidebar.list.setCurrentItem(other)
    window.sidebar.list.itemClicked.emit(other)  # refused: an answer is streaming
    assert window.controller.conversation.id == open_id and current_id(window) == open_id
    with qtbot.waitSignal(window.controller.answer_finished, timeout=ANSWER_TIMEOUT_MS):
        window.controller.cancel()


@pytest.mark.any_model
def test_a_conversation_can_have_its_own_system_prompt(qtbot, window):
    from app.widgets.settings_dialog import ConversationSettingsDialog
    dialog = ConversationSettingsDialog(window.controller.settings, {"system_prompt": "Answer in French."}, window)
    assert dialog.own_prompt.isChecked() and dialog.overrides()["system_prompt"] == "Answer in French."
    dialog.own_prompt.setChecked(False)
    assert "system_prompt" not in dialog.overrides()
    window.controller.set_overrides({"system_prompt": "Answer in French."})
    answer(qtbot, window, lambda: window.controller.send("Hello"))
    assert window.controller.models.session.messages[0] == {"role": "system", "content": "Answer in French."}
    window.new_conversation()
    answer(qtbot, window, lambda: window.controller.send("Hello"))
    assert window.controller.models.session.messages[0]["content"] == window.controller.settings.system_prompt


def test_the_theme_can_follow_the_system(qtbot, window, monkeypatch):
    import app.theme
    from PySide6.QtGui import QGuiApplication, QPalette
    hints = QGuiApplication.styleHints()  # the offscreen platform cannot switch schemes: tell it
    window.apply_settings(replace(window.controller.settings, theme="system"))
    try:
        monkeypatch.setattr(app.theme, "system_is_dark", lambda: True)
        hints.colorSchemeChanged.emit(Qt.ColorScheme.Dark)
        assert window.chat_view._dark
        dark_window = QApplication.palette().color(QPalette.ColorRole.Window)
        monkeypatch.setattr(app.theme, "system_is_dark", lambda: False)
        hints.colorSchemeChanged.emit(Qt.ColorScheme.Light)
        assert not window.chat_view._dark
        assert QApplication.palette().color(QPalette.ColorRole.Window).lightness() > dark_window.lightness()
    finally:
        window.apply_settings(replace(window.controller.settings, theme="light"))


def test_text_size_changes_with_ctrl_plus_and_minus_and_is_kept(qtbot, window):
    from app.settings import load_settings
    base = QApplication.font().pointSizeF()
    try:
        window.menu_actions["larger"].trigger()
        assert QApplication.font().pointSizeF() > base
        assert load_settings(window.settings_path)[0].text_scale == 110
        window.menu_actions["smaller"].trigger()
        window.menu_actions["smaller"].trigger()
        assert QApplication.font().pointSizeF() < base
        assert {k.toString() for k in window.menu_actions["larger"].shortcuts()} >= {"Ctrl++"}
        assert window.menu_actions["smaller"].shortcut().toString() == "Ctrl+-"
    finally:
        window.menu_actions["text_reset"].trigger()
    assert QApplication.font().pointSizeF() == base


def test_icon_title_and_accessible_names(qtbot, window):
    assert not window.windowIcon().isNull()
    answer(qtbot, window, lambda: window.controller.send("Hello"))
    assert window.windowTitle() == "Hello — Sprig"
    window.error_banner.show_text("something")
    unnamed = []
    for widget in window.findChildren(QWidget):
        if not widget.isVisible():
            continue
        wordless = isinstance(widget, QAbstractButton) and not any(ch.isalpha() for ch in widget.text())
        if (wordless or isinstance(widget, (QLineEdit, QPlainTextEdit, QListWidget, QProgressBar))) \
                and not widget.accessibleName():
            unnamed.append(widget)
    assert not unnamed


def test_keyboard_focus_is_visible(qtbot, window):
    window.activateWindow()
    qtbot.waitUntil(lambda: QApplication.activeWindow() is window)
    button = window.model_bar.unload_button
    window.input.setFocus()
    qtbot.waitUntil(lambda: not button.hasFocus())
    unfocused = button.grab().toImage()
    button.setFocus(Qt.FocusReason.TabFocusReason)
    qtbot.waitUntil(button.hasFocus)
    assert button.grab().toImage() != unfocused


def test_checkboxes_are_legible_in_the_dark_theme(qtbot, window):
    from PySide6.QtGui import QColor
    window.apply_settings(replace(window.controller.settings, theme="dark"))
    try:
        box = QCheckBox()
        qtbot.addWidget(box)
        box.resize(box.sizeHint())
        background = QApplication.palette().color(box.backgroundRole())
        image = box.grab().toImage()
        contrast = max(abs(QColor(image.pixel(x, y)).lightness() - background.lightness())
                       for x in range(image.width()) for y in range(image.height()))
        assert contrast >= 80  # the empty box's outline stands out from the dark background
    finally:
        window.apply_settings(replace(window.controller.settings, theme="light"))


def test_the_model_picker_tells_files_apart_sorts_and_filters(qtbot, window, tmp_path):
    from app.widgets.model_picker import FILE, MODEL, PARAMETERS, QUANTIZATION
    (tmp_path / "models").mkdir()
    small = write_tiny_model(tmp_path / "models" / "small-one.gguf", "qwen3", d_model=32, head_dim=8, d_ff=64)
    large = write_tiny_model(tmp_path / "models" / "large-one.gguf", "qwen3", d_model=128, d_ff=256)
    picker = window.open_model_picker()
    try:
        picker.wait_for_headers()
        qtbot.wait(50)
        table = picker.table
        files = [table.item(row, FILE).text() for row in range(table.rowCount())]
        assert any(text.startswith("small-one.gguf") and text.endswith("— models") for text in files)
        # Sorting by parameters puts the small tiny model first and the large one after it.
        table.sortByColumn(PARAMETERS, Qt.SortOrder.AscendingOrder)
        order = [table.item(row, FILE).text().split()[0] for row in range(table.rowCount())]
        assert order.index("small-one.gguf") < order.index("large-one.gguf")
        assert order[-1] != "small-one.gguf"
        # The filter keeps the matching rows only.
        picker.filter.setText("large-one")
        shown = [row for row in range(table.rowCount()) if not table.isRowHidden(row)]
        assert [table.item(row, FILE).text().split()[0] for row in shown] == ["large-one.gguf"]
        assert table.item(shown[0], QUANTIZATION).text() == "F32"
        # The sorted, filtered row still loads its own file.
        table.selectRow(shown[0])
        with qtbot.waitSignal(picker.load_requested) as requested:
            picker.load_button.click()
        assert requested.args[0] == str(large) and table.item(shown[0], MODEL).text()
    finally:
        picker.close()
    assert small.exists()


@pytest.mark.any_model
def test_an_edit_keeps_the_earlier_question_with_its_answers(qtbot, window):
    answer(qtbot, window, lambda: window.controller.send("What is the capital of France?"))
    answer(qtbot, window, lambda: window.controller.send("And of Germany?"))
    before = [m.content for m in stored(window)]
    answer(qtbot, window, lambda: window.chat_view.edit_submitted.emit(0, "What is the capital of Italy?"))
    after = [m.content for m in stored(window)]
    assert len(after) == 2 and after[0] == "What is the capital of Italy?"
    card = window.chat_view._messages[0]
    assert card.version_label.text() == "2/2"
    card.previous_button.click()  # back to the first question, and the talk that followed it
    assert [m.content for m in stored(window)] == before
    assert window.chat_view.message_texts() == before
    exported = to_json(window.controller.conversation, stored(window))
    imported = import_json(window.store, json.loads(json.dumps(exported)))
    copy = window.store.messages(imported.id)
    window.store.show_version(copy[0].id, 1)
    assert [m.content for m in window.store.messages(imported.id)] == after
    window.chat_view._messages[0].next_button.click()
    assert [m.content for m in stored(window)] == after


def test_a_failed_load_keeps_the_last_answers_figures(qtbot, window, tmp_path):
    answer(qtbot, window, lambda: window.controller.send("Hi"))
    figures = window.metrics.generated.text()
    assert figures != "—"
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\xff" * 64)
    with qtbot.waitSignal(window.controller.error, timeout=LOAD_TIMEOUT_MS):
        window.add_model(str(broken))
    qtbot.waitUntil(lambda: not window.controller.busy)
    assert window.metrics.generated.text() == figures and window.error_banner.isVisible()


def test_copying_says_copied(qtbot):
    from PySide6.QtWidgets import QToolTip
    from app.widgets.message_widget import COPIED_FEEDBACK_MS, MessageWidget
    card = MessageWidget({"role": "assistant", "content": "Here:\n\n```python\nprint(1)\n```\n"})
    qtbot.addWidget(card)
    card.show()
    card.copy_button.click()
    assert card.copy_button.text() == "Copied"
    qtbot.waitUntil(lambda: card.copy_button.text() == "Copy", timeout=COPIED_FEEDBACK_MS + 2000)
    card.open_link("copy-code:0", "Here:\n\n```python\nprint(1)\n```\n")
    assert QApplication.clipboard().text() == "print(1)\n"
    assert QToolTip.isVisible() and QToolTip.text() == "Copied"
