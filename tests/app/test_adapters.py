"""LoRA adapters in the app: listed under the model they fit (app/adapter_library.py),
chosen per conversation with a scale (the Adapters dialog), stored with the conversation,
applied to its answers, and a misfit refused with the engine's message in the error banner.

The model and adapters are tools/fixtures/make_lora_embedding_fixtures.py's tiny Qwen3 base and its
PEFT adapters (tests/engine/test_lora.py checks their numbers against PEFT)."""

import shutil
from dataclasses import replace
from pathlib import Path

import pytest
from PySide6.QtWidgets import QLabel

from app.adapter_library import (
    ADAPTERS_FOLDER,
    AdapterFile,
    adapters_for,
    conversation_adapters,
    find_adapters,
    with_adapters,
)
from app.header_reader import HeaderReader
from app.model_library import LibraryEntry
from app.widgets.adapters_dialog import AdaptersDialog
from app.widgets.model_picker import ADAPTERS, ModelPicker
from tests.app.conftest import answer, close_window, load, make_window, quick_settings

MODELS = Path(__file__).resolve().parents[1] / "fixtures" / "models"
BASE = MODELS / "tiny-lora-base-f32.gguf"


@pytest.fixture
def models_folder(tmp_path):
    """A models folder whose adapters folder holds the three adapters and a model (no adapter)."""
    folder = tmp_path / "models"
    (folder / ADAPTERS_FOLDER).mkdir(parents=True)
    for name in ("tiny-lora-a", "tiny-lora-b", "tiny-lora-other"):
        shutil.copy(MODELS / f"{name}.gguf", folder / ADAPTERS_FOLDER)
    shutil.copy(MODELS / "tiny-embed-cls-f32.gguf", folder / ADAPTERS_FOLDER)
    return folder


def test_adapters_are_listed_under_the_models_they_fit(models_folder):
    found = find_adapters(models_folder)
    assert [a.name for a in found] == ["tiny-lora-a", "tiny-lora-b", "tiny-lora-other"]  # the model is no adapter
    assert all(a.architecture == "qwen3" for a in found)
    assert adapters_for("llama", ["SmolLM2"], found) == []
    assert len(adapters_for("qwen3", ["Base"], found)) == 3
    made_for = AdapterFile(Path("x.gguf"), "x", "qwen3", "Qwen3 8B")
    assert adapters_for("qwen3", ["Qwen3-8B"], [made_for]) == [made_for]
    assert adapters_for("qwen3", ["Base"], [made_for]) == []


def test_the_model_picker_lists_the_adapters_under_each_model(qtbot, models_folder):
    entries = [LibraryEntry(BASE, "base"), LibraryEntry(MODELS / "tiny-phi3-q4_k_m.gguf", "phi3")]
    headers = HeaderReader()
    picker = ModelPicker(entries, headers, 512, models_folder)
    qtbot.addWidget(picker)
    try:
        picker.wait_for_headers()
        cells = {picker.table.item(row, 0).text(): picker.table.item(row, ADAPTERS) for row in range(2)}
        assert cells["base"].text() == "3" and "tiny-lora-a, tiny-lora-b, tiny-lora-other" in cells["base"].toolTip()
        assert cells["phi3"].text() == "—" and "No LoRA adapter" in cells["phi3"].toolTip()
    finally:
        picker.close()
        headers.stop()


def test_a_conversations_adapters_round_trip_through_its_overrides():
    overrides = with_adapters({"temperature": 0.5}, [("a.gguf", 0.5), ("b.gguf", 9.0)])
    assert overrides["temperature"] == 0.5
    assert conversation_adapters(overrides) == [("a.gguf", 0.5), ("b.gguf", 4.0)]  # clamped
    assert conversation_adapters({"adapters": [{"path": 3}, "x", {"path": "c.gguf", "scale": True}]}) == []
    assert with_adapters(overrides, []) == {"temperature": 0.5}


def choose(monkeypatch, picks: dict[str, float]) -> None:
    """Make the Adapters dialog check `picks` (name -> scale) and press OK."""

    def exec_(dialog: AdaptersDialog) -> int:
        for adapter, check, scale in dialog.rows:
            check.setChecked(adapter.name in picks)
            scale.setValue(picks.get(adapter.name, 1.0))
        return 1

    monkeypatch.setattr(AdaptersDialog, "exec", exec_)


def answer_text(window) -> str:
    return window.store.messages(window.controller.conversation.id)[-1].content


def test_each_conversation_answers_with_its_own_adapters(qtbot, tmp_path, models_folder, monkeypatch):
    settings = replace(quick_settings(tmp_path), models_folder=models_folder, max_tokens=8)
    window = make_window(qtbot, tmp_path / "data", settings)
    try:
        load(qtbot, window, BASE)
        answer(qtbot, window, lambda: window.controller.send("Once upon a time"))
        plain = answer_text(window)

        window.new_conversation()
        choose(monkeypatch, {"tiny-lora-a": 1.0})
        window.open_adapters()
        conversation = window.controller.conversation
        stored = window.store.conversation(conversation.id).overrides["adapters"]
        assert stored == [{"path": str(models_folder / ADAPTERS_FOLDER / "tiny-lora-a.gguf"), "scale": 1.0}]
        answer(qtbot, window, lambda: window.controller.send("Once upon a time"))
        adapted = answer_text(window)
        assert adapted != plain

        window.new_conversation()  # no adapters: the base model's answer again, bit for bit
        answer(qtbot, window, lambda: window.controller.send("Once upon a time"))
        assert answer_text(window) == plain
        assert not window.error_banner.isVisible()
    finally:
        close_window(window)


def test_a_misfit_adapter_is_refused_in_the_banner(qtbot, tmp_path, models_folder, monkeypatch):
    settings = replace(quick_settings(tmp_path), models_folder=models_folder, max_tokens=4)
    window = make_window(qtbot, tmp_path / "data", settings)
    try:
        load(qtbot, window, BASE)
        choose(monkeypatch, {"tiny-lora-other": 1.0})  # made on a base of another width
        window.open_adapters()
        answer(qtbot, window, lambda: window.controller.send("Once upon a time"))
        assert window.error_banner.isVisible()
        assert "another base model" in window.error_banner.text()
        choose(monkeypatch, {})  # taken off: the conversation answers again
        window.open_adapters()
        answer(qtbot, window, lambda: window.controller.send("Once upon a time"))
        assert answer_text(window)
    finally:
        close_window(window)


def test_the_dialog_says_where_adapters_go_when_none_fits(qtbot, tmp_path):
    dialog = AdaptersDialog("SmolLM2", [], [], tmp_path / "models")
    qtbot.addWidget(dialog)
    assert dialog.chosen() == []
    assert any("convert_lora_to_gguf" in label.text() for label in dialog.findChildren(QLabel))
