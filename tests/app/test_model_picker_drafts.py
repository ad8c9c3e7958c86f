"""The model picker's Drafts column: which models can draft for the loaded one, and why not."""

from app.header_reader import HeaderReader
from app.model_library import LibraryEntry
from app.widgets.model_picker import DRAFTS, ModelPicker
from engine.bundled import bundled_model
from engine.gguf_file import open_gguf
from engine.model_info import vocabulary_metadata
from tests.gguf_factory import tiny_vocab, write_tiny_model


def test_drafts_column_says_which_models_can_draft_and_why_not(qtbot, tmp_path):
    tokens, _ = tiny_vocab(288)
    renamed = [*tokens[:270], "renamed", *tokens[271:]]
    loaded = write_tiny_model(tmp_path / "loaded.gguf", seed=0)
    paths = [
        loaded,
        write_tiny_model(tmp_path / "same-vocab.gguf", n_layers=1, seed=1),
        write_tiny_model(tmp_path / "renamed.gguf", seed=2, **{"tokenizer.ggml.tokens": renamed}),
        bundled_model("smollm2").path,
    ]
    entries = [LibraryEntry(path, path.stem) for path in paths]
    target = vocabulary_metadata(open_gguf(loaded).metadata)
    headers = HeaderReader()
    picker = ModelPicker(entries, headers, 512, tmp_path, current=loaded, draft_target=target)
    qtbot.addWidget(picker)
    try:
        picker.wait_for_headers()
        cells = {picker.table.item(row, 0).text(): picker.table.item(row, DRAFTS) for row in range(len(paths))}
        assert cells["loaded"].text() == "loaded"
        assert cells["same-vocab"].text() == "yes"
        assert cells["renamed"].text() == "no"
        assert cells["renamed"].toolTip() == (
            "Cannot draft for the loaded model: token 270 differs ('<|reserved_6|>' and 'renamed')."
        )
        smollm2 = cells["SmolLM2-135M-Instruct.Q4_1"]
        assert smollm2.text() == "no" and "the vocabularies differ in size" in smollm2.toolTip()
    finally:
        picker.close()
        headers.stop()


def test_without_a_loaded_model_the_drafts_column_explains_itself(qtbot, tmp_path):
    path = write_tiny_model(tmp_path / "any.gguf")
    headers = HeaderReader()
    picker = ModelPicker([LibraryEntry(path, "any")], headers, 512, tmp_path)
    qtbot.addWidget(picker)
    try:
        picker.wait_for_headers()
        cell = picker.table.item(0, DRAFTS)
        assert cell.text() == "—" and "Load a model" in cell.toolTip()
    finally:
        picker.close()
        headers.stop()
