"""Per-model settings: kept per file (found again after a move), applied at load or at once,
under a conversation's own settings, and edited in the Model settings… dialog."""

from dataclasses import replace

import pytest
from PySide6.QtWidgets import QDialogButtonBox

from app.model_settings import ModelSettings, check_template, with_model_settings
from app.settings import Settings, effective_sampling
from app.storage import StorageError, Store
from app.widgets.model_settings_dialog import ModelSettingsDialog
from engine.builtin_templates import CHATML
from tests.app.conftest import LOAD_TIMEOUT_MS, answer, close_window, load, make_window, quick_settings
from tests.gguf_factory import tiny_vocab, write_tiny_model


def test_settings_are_kept_per_file_and_follow_a_moved_file(tmp_path):
    (tmp_path / "a").mkdir()
    model = write_tiny_model(tmp_path / "a" / "tiny.gguf")
    store = Store(tmp_path / "sprig.sqlite3")
    try:
        kept = ModelSettings(context_length=512, system_prompt="Be brief.", speculative="off")
        store.set_model_settings(model, kept)
        assert store.model_settings(model) == kept
        assert store.model_settings(tmp_path / "other.gguf") == ModelSettings()

        moved = tmp_path / "b" / "tiny.gguf"
        moved.parent.mkdir()
        model.rename(moved)
        assert store.model_settings(moved) == kept  # same name and size, the old path gone
        assert store.model_settings(model) == ModelSettings()  # now kept under the new path only

        with pytest.raises(StorageError, match="does not exist"):
            store.set_model_settings(tmp_path / "gone.gguf", kept)
        store.set_model_settings(moved, ModelSettings())
        assert store.model_settings(moved) == ModelSettings()
    finally:
        store.close()


def test_a_copy_beside_the_original_does_not_take_its_settings(tmp_path):
    (tmp_path / "a").mkdir()
    model = write_tiny_model(tmp_path / "a" / "tiny.gguf")
    copy = tmp_path / "b" / "tiny.gguf"
    copy.parent.mkdir()
    copy.write_bytes(model.read_bytes())
    store = Store(tmp_path / "sprig.sqlite3")
    try:
        store.set_model_settings(model, ModelSettings(cpu_threads=2))
        assert store.model_settings(copy) == ModelSettings()  # the original is still where it was
    finally:
        store.close()


def test_bad_stored_values_follow_the_app_settings():
    stored = '{"context_length": 10, "cpu_threads": 4, "speculative": "sideways", "template": 3, "x": 1}'
    assert ModelSettings.from_json(stored) == ModelSettings(cpu_threads=4)
    assert ModelSettings.from_json("not json") == ModelSettings()


def test_model_settings_go_over_the_app_and_under_the_conversation():
    app = replace(Settings.defaults(), system_prompt="App prompt.", context_length=4096)
    model = ModelSettings(system_prompt="Model prompt.", context_length=1024, speculative="draft")
    merged = with_model_settings(app, model)
    assert (merged.system_prompt, merged.context_length, merged.speculative) == ("Model prompt.", 1024, "auto")
    assert with_model_settings(app, model, has_draft=True).speculative == "draft"
    assert effective_sampling(merged, {"system_prompt": "Chat prompt."}).system_prompt == "Chat prompt."


def test_a_kv_type_is_kept_and_an_unknown_one_follows_the_default():
    assert ModelSettings.from_json(ModelSettings(kv_type="q8_0").to_json()) == ModelSettings(kv_type="q8_0")
    assert ModelSettings.from_json('{"kv_type": "q4_0"}') == ModelSettings()


def test_a_kv_type_setting_reloads_the_model_with_that_cache(qtbot, tiny_window):
    window, model = tiny_window
    assert window.controller.loaded.model.kv_type == "f16"  # the default
    with qtbot.waitSignal(window.controller.models.model_loaded, timeout=LOAD_TIMEOUT_MS):
        window.controller.models.set_model_settings(model, ModelSettings(kv_type="f32"))
    assert window.controller.loaded.model.kv_type == "f32"
    answer(qtbot, window, lambda: window.controller.send("Hi"))
    assert window.controller.models.session.cache.storage.keys[0].dtype == "float32"


def test_a_broken_template_is_refused_with_the_renderers_message():
    assert check_template(CHATML) is None
    assert "not valid Jinja" in check_template("{% for m in messages %}")
    assert "has no attribute 'nope'" in check_template("{{ messages[0].nope.deeper }}")


@pytest.fixture
def tiny_window(qtbot, tmp_path):
    """A window with a tiny Qwen3 loaded, and the model's path."""
    model = write_tiny_model(tmp_path / "tiny.gguf", **{"qwen3.context_length": 4096})
    window = make_window(qtbot, tmp_path / "data", quick_settings(tmp_path, context_length=2048, max_tokens=4))
    load(qtbot, window, model)
    yield window, model
    close_window(window)


def test_context_and_system_prompt_apply_at_once_and_the_chat_prompt_wins(qtbot, tiny_window):
    window, model = tiny_window
    controller = window.controller
    with qtbot.waitSignal(controller.models.context_changed, timeout=LOAD_TIMEOUT_MS) as changed:
        controller.models.set_model_settings(model, ModelSettings(context_length=512, system_prompt="Model prompt."))
    assert changed.args == [512]
    answer(qtbot, window, lambda: controller.send("Hi"))
    assert controller.models.session.messages[0] == {"role": "system", "content": "Model prompt."}

    controller.set_overrides({"system_prompt": "Chat prompt."})
    answer(qtbot, window, controller.regenerate)
    assert controller.models.session.messages[0] == {"role": "system", "content": "Chat prompt."}


def test_a_template_override_reloads_the_model_and_is_used(qtbot, tiny_window):
    window, model = tiny_window
    with qtbot.waitSignal(window.controller.models.model_loaded, timeout=LOAD_TIMEOUT_MS):
        window.controller.models.set_model_settings(model, ModelSettings(template=CHATML))
    rendered = window.controller.loaded.template.render([{"role": "user", "content": "Hi"}])
    assert rendered == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"


def test_a_draft_model_from_the_library_drafts_and_a_wrong_one_is_explained(qtbot, tmp_path, tiny_window):
    window, model = tiny_window
    controller = window.controller
    draft = write_tiny_model(tmp_path / "draft.gguf", n_layers=1, seed=1)
    with qtbot.waitSignal(controller.models.model_loaded, timeout=LOAD_TIMEOUT_MS):
        controller.models.set_model_settings(model, ModelSettings(speculative="draft", draft_model=str(draft)))
    assert controller.models.draft is not None and controller.models.draft.path == draft
    assert controller.models.session.speculation.mode == "draft"
    _metrics, state = answer(qtbot, window, lambda: controller.send("Hi"))
    assert state == "complete"
    assert controller.models.session.speculation._draft_drafter.model is controller.models.draft.model  # it drafted the answer

    tokens, _ = tiny_vocab(288)
    wrong = write_tiny_model(
        tmp_path / "wrong.gguf", seed=2, **{"tokenizer.ggml.tokens": [*tokens[:270], "renamed", *tokens[271:]]}
    )
    with qtbot.waitSignal(controller.model_notice, timeout=LOAD_TIMEOUT_MS) as notice:
        controller.models.set_model_settings(model, ModelSettings(speculative="draft", draft_model=str(wrong)))
    assert "answers without its draft model" in notice.args[0] and "token 270 differs" in notice.args[0]
    qtbot.waitUntil(lambda: not controller.busy, timeout=LOAD_TIMEOUT_MS)
    assert controller.models.draft is None and controller.models.session.speculation.mode == "auto"


def test_the_dialog_offers_only_drafts_that_share_the_vocabulary_and_refuses_a_broken_template(
    qtbot, tmp_path, tiny_window
):
    window, model = tiny_window
    tokens, _ = tiny_vocab(288)
    window.store.add_model(str(write_tiny_model(tmp_path / "same.gguf", n_layers=1, seed=1)), "same")
    renamed = [*tokens[:270], "renamed", *tokens[271:]]
    window.store.add_model(
        str(write_tiny_model(tmp_path / "wrong.gguf", seed=2, **{"tokenizer.ggml.tokens": renamed})), "wrong"
    )
    window.menu_actions["model_settings"].trigger()
    (dialog,) = window.findChildren(ModelSettingsDialog)
    assert str(model) in dialog.hint.text() and "Chat → Chat settings" in dialog.hint.text()
    items = dialog.draft.model()
    qtbot.waitUntil(lambda: dialog.draft.findText("wrong (cannot draft)") >= 0, timeout=LOAD_TIMEOUT_MS)
    assert items.item(dialog.draft.findText("same")).isEnabled()
    assert not items.item(dialog.draft.findText("wrong (cannot draft)")).isEnabled()

    dialog.template_choice.setCurrentIndex(dialog.template_choice.findData("chatml"))
    assert dialog.template.toPlainText() == CHATML
    dialog.template.setPlainText("{% if %}")
    assert dialog.template_choice.currentData() == "custom"
    dialog.findChild(QDialogButtonBox).button(QDialogButtonBox.StandardButton.Ok).click()
    assert dialog.isVisible() and "not valid Jinja" in dialog.template_error.text()
    assert window.store.model_settings(model) == ModelSettings()  # nothing kept

    dialog.template_choice.setCurrentIndex(dialog.template_choice.findData("own"))
    dialog._ticks["system_prompt"].setChecked(True)
    dialog.system_prompt.setPlainText("Model prompt.")
    dialog.draft.setCurrentIndex(dialog.draft.findText("same"))
    dialog.findChild(QDialogButtonBox).button(QDialogButtonBox.StandardButton.Ok).click()
    kept = window.store.model_settings(model)
    assert kept == ModelSettings(system_prompt="Model prompt.", draft_model=str(tmp_path / "same.gguf"))
