"""Settings: the file format and its rules, the two settings dialogs, and the themes."""

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QPalette
from PySide6.QtWidgets import QDialogButtonBox, QFileDialog, QLabel, QPushButton

from app import settings as settings_module
from app.settings import (
    DEFAULTS_FILE,
    SAMPLING_FIELDS,
    Settings,
    default_models_folder,
    effective_sampling,
    load_settings,
    sampling_params,
    save_settings,
)
from app.theme import apply_theme
from app.widgets.settings_dialog import ConversationSettingsDialog, SettingsDialog
from engine.sampling import SamplingParams


def custom_settings() -> Settings:
    """Settings that differ from the defaults in every field."""
    return Settings(
        system_prompt="Answer like a pirate.\nAlways.",
        temperature=1.3,
        top_k=7,
        top_p=0.8,
        min_p=0.1,
        repeat_penalty=1.25,
        max_tokens=900,
        seed=1234,
        context_length=8192,
        backend="numpy",
        cpu_threads=3,
        speculative="ngram",
        models_folder=Path("/tmp/sprig-models"),
        theme="dark",
        text_scale=130,
        last_model="/tmp/sprig-models/smol.gguf",
        last_conversation=7,
        hub_offline=True,
        server_port=8123,
        server_origins="http://localhost:3000",
        server_network=True,
        window_geometry="AdnQywADAAA=",
    )


# ---- the file ---------------------------------------------------------------------


def test_defaults_come_from_the_resource_file():
    data = json.loads(DEFAULTS_FILE.read_text(encoding="utf-8"))
    defaults = Settings.defaults()
    assert defaults.system_prompt == data["system_prompt"] == "You are a helpful assistant."
    assert (defaults.temperature, defaults.top_k, defaults.top_p, defaults.min_p) == (0.7, 40, 0.95, 0.05)
    assert (defaults.repeat_penalty, defaults.max_tokens, defaults.context_length) == (1.1, 512, 4096)
    assert (defaults.seed, defaults.backend, defaults.theme, defaults.last_model) == (None, "auto", "system", None)
    assert (defaults.text_scale, defaults.last_conversation) == (100, None)
    assert defaults.cpu_threads == 0  # one thread per physical core
    assert defaults.speculative == data["speculative"] == "auto"
    assert defaults.models_folder == default_models_folder()
    assert default_models_folder().parts[-2:] == ("Sprig", "models")


def test_defaults_are_a_fresh_copy_each_time():
    first = Settings.defaults()
    first.temperature = 3.0
    assert Settings.defaults().temperature == 0.7


def test_save_then_load_gives_equal_settings(tmp_path):
    path = tmp_path / "nested" / "settings.json"
    save_settings(custom_settings(), path)
    loaded, warnings = load_settings(path)
    assert loaded == custom_settings()
    assert warnings == []
    assert sorted(p.name for p in path.parent.iterdir()) == ["settings.json"]  # no temp file left


def test_missing_file_gives_defaults_without_warnings(tmp_path):
    assert load_settings(tmp_path / "absent.json") == (Settings.defaults(), [])


@pytest.mark.parametrize("text", ["{not json", "[1, 2, 3]", "\xff\xfe"])
def test_corrupt_file_gives_defaults_and_one_warning_naming_it(tmp_path, text):
    path = tmp_path / "settings.json"
    path.write_bytes(text.encode("latin-1"))
    loaded, warnings = load_settings(path)
    assert loaded == Settings.defaults()
    assert len(warnings) == 1 and str(path) in warnings[0]


def test_bad_fields_fall_back_one_by_one(tmp_path):
    path = tmp_path / "settings.json"
    path.write_text(
        json.dumps(
            {
                "temperature": "hot",
                "top_k": True,
                "max_tokens": 12.5,
                "backend": "tpu",
                "theme": 3,
                "speculative": "sometimes",
                "models_folder": "",
                "system_prompt": "Be brief.",
                "seed": 99,
                "some_future_setting": 1,
            }
        )
    )
    loaded, warnings = load_settings(path)
    defaults = Settings.defaults()
    assert loaded == replace(defaults, system_prompt="Be brief.", seed=99)
    named = ["temperature", "top_k", "max_tokens", "backend", "theme", "speculative", "models_folder"]
    assert len(warnings) == len(named)
    for field, warning in zip(named, warnings):
        assert warning.startswith(f"Settings file {path}: {field} ")


@pytest.mark.parametrize(
    "field, value, expected",
    [
        ("temperature", -1, 0.0),
        ("temperature", 9.5, 5.0),
        ("top_k", -3, 0),
        ("top_p", 1.5, 1.0),
        ("min_p", -0.2, 0.0),
        ("repeat_penalty", 0.5, 1.0),
        ("max_tokens", 0, 1),
        ("max_tokens", 10**6, 32768),
        ("context_length", 100, 256),
        ("context_length", 10**7, 131072),
    ],
)
def test_out_of_range_numbers_are_clamped_with_a_warning(tmp_path, field, value, expected):
    path = tmp_path / "settings.json"
    path.write_text(json.dumps({field: value}))
    loaded, warnings = load_settings(path)
    assert getattr(loaded, field) == expected
    assert type(getattr(loaded, field)) is type(getattr(Settings.defaults(), field))
    assert len(warnings) == 1 and field in warnings[0]


def test_a_failed_save_keeps_the_old_file_and_leaves_no_temp(tmp_path, monkeypatch):
    path = tmp_path / "settings.json"
    save_settings(Settings.defaults(), path)
    before = path.read_bytes()

    def refuse(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(settings_module.os, "replace", refuse)
    with pytest.raises(OSError, match="disk full"):
        save_settings(custom_settings(), path)
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["settings.json"]


def test_settings_load_without_qt():
    """The settings core stays Qt-free, imports of imports included."""
    code = "import sys, app.settings; print(sorted(m for m in sys.modules if m.startswith(('PySide', 'shiboken'))))"
    root = Path(__file__).resolve().parents[2]
    result = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


# ---- sampling ---------------------------------------------------------------------


def test_overrides_apply_to_sampling_fields_and_the_system_prompt_only():
    base = custom_settings()
    merged = effective_sampling(
        base,
        {
            "temperature": 0.2,
            "seed": None,
            "top_p": 7,  # clamped
            "top_k": "many",  # wrong type: the global value stays
            "system_prompt": "Per chat.",
            "backend": "mlx",  # ignored: not something one conversation sets
            "bogus": 1,
        },
    )
    assert merged == replace(base, temperature=0.2, seed=None, top_p=1.0, system_prompt="Per chat.")
    assert base.temperature == 1.3  # the global settings are not touched


def test_sampling_params_carry_every_sampler_field():
    params = sampling_params(custom_settings())
    assert params == SamplingParams(temperature=1.3, top_k=7, top_p=0.8, min_p=0.1, repeat_penalty=1.25, seed=1234)


def test_sampling_fields_are_settings_fields():
    defaults = Settings.defaults()
    assert all(hasattr(defaults, name) for name in SAMPLING_FIELDS)


# ---- the dialogs ------------------------------------------------------------------


@pytest.fixture
def dialog(qtbot):
    dialog = SettingsDialog(
        replace(Settings.defaults(), last_model="/models/a.gguf"), ["cuda: pycuda is not installed"]
    )
    qtbot.addWidget(dialog)
    return dialog


def test_dialog_returns_what_the_widgets_show(dialog):
    dialog.system_prompt.setPlainText("Answer in French.")
    dialog.context_length.setValue(8192)
    form = dialog.sampling.editors
    form["temperature"].setValue(1.25)
    form["top_k"].setValue(12)
    form["top_p"].setValue(0.5)
    form["min_p"].setValue(0.2)
    form["repeat_penalty"].setValue(1.3)
    form["max_tokens"].setValue(2048)
    form["seed"].random.setChecked(False)
    form["seed"].spin.setValue(77)
    dialog.backend.setCurrentIndex(dialog.backend.findData("numpy"))
    dialog.cpu_threads.setValue(2)
    dialog.speculative.setCurrentIndex(dialog.speculative.findData("off"))
    dialog.theme.setCurrentIndex(dialog.theme.findData("dark"))
    dialog.models_folder.setText("/data/models")
    dialog.hub_offline.setChecked(True)

    assert dialog.settings() == Settings(
        system_prompt="Answer in French.",
        temperature=1.25,
        top_k=12,
        top_p=0.5,
        min_p=0.2,
        repeat_penalty=1.3,
        max_tokens=2048,
        seed=77,
        context_length=8192,
        backend="numpy",
        cpu_threads=2,
        speculative="off",
        models_folder=Path("/data/models"),
        theme="dark",
        text_scale=100,
        last_model="/models/a.gguf",
        last_conversation=None,
        hub_offline=True,
        server_port=8080,  # the server panel's own settings, as the dialog was given them
        server_origins="",
        server_network=False,
    )


def test_dialog_shows_the_settings_it_was_given(qtbot):
    dialog = SettingsDialog(custom_settings(), [])
    qtbot.addWidget(dialog)
    assert dialog.settings() == custom_settings()
    assert dialog.sampling.editors["seed"].spin.value() == 1234


def test_random_seed_greys_the_number(dialog):
    seed = dialog.sampling.editors["seed"]
    assert seed.random.isChecked() and not seed.spin.isEnabled()
    seed.random.setChecked(False)
    assert seed.spin.isEnabled() and dialog.settings().seed == seed.spin.value()


def test_restore_defaults_resets_every_field_but_those_it_does_not_show(qtbot):
    dialog = SettingsDialog(custom_settings(), [])
    qtbot.addWidget(dialog)
    dialog.findChild(QDialogButtonBox).button(QDialogButtonBox.StandardButton.RestoreDefaults).click()
    custom = custom_settings()
    assert dialog.settings() == replace(
        Settings.defaults(),
        last_model=custom.last_model,
        last_conversation=custom.last_conversation,
        text_scale=custom.text_scale,
        server_port=custom.server_port,  # the server panel's settings, and the window's own
        server_origins=custom.server_origins,
        server_network=custom.server_network,
        window_geometry=custom.window_geometry,
    )


def test_an_empty_models_folder_keeps_the_old_one(dialog):
    dialog.models_folder.setText("   ")
    assert dialog.settings().models_folder == default_models_folder()


def test_browse_puts_the_chosen_folder_in_the_field(dialog, qtbot, monkeypatch, tmp_path):
    asked = []

    def choose(parent, caption, start):
        asked.append(start)
        return str(tmp_path)

    monkeypatch.setattr(QFileDialog, "getExistingDirectory", staticmethod(choose))
    browse = next(b for b in dialog.findChildren(QPushButton) if b.text() == "Browse…")
    qtbot.mouseClick(browse, Qt.MouseButton.LeftButton)
    assert asked == [str(default_models_folder())]
    assert dialog.settings().models_folder == tmp_path


def test_backend_reasons_are_shown(dialog):
    reasons = dialog.findChild(QLabel, "BackendReasons")
    assert "cuda: pycuda is not installed" in reasons.text()
    assert not reasons.isHidden()


@pytest.fixture
def conversation_dialog(qtbot):
    dialog = ConversationSettingsDialog(custom_settings(), {"temperature": 0.3, "seed": None, "bogus": 5})
    qtbot.addWidget(dialog)
    return dialog


def test_conversation_overrides_hold_only_ticked_fields(conversation_dialog):
    form = conversation_dialog.form
    assert conversation_dialog.overrides() == {"temperature": 0.3, "seed": None}
    form.checks["top_k"].setChecked(True)
    form.editors["top_k"].setValue(5)
    form.checks["temperature"].setChecked(False)
    assert conversation_dialog.overrides() == {"top_k": 5, "seed": None}


def test_unticked_fields_are_greyed_and_show_the_global_value(conversation_dialog):
    form = conversation_dialog.form
    assert not form.editors["top_p"].isEnabled() and form.editors["top_p"].value() == 0.8
    assert form.editors["temperature"].isEnabled()
    form.editors["temperature"].setValue(2.0)
    form.checks["temperature"].setChecked(False)
    assert not form.editors["temperature"].isEnabled()
    assert form.editors["temperature"].value() == 1.3


def test_use_global_settings_clears_the_overrides(conversation_dialog):
    box = conversation_dialog.findChild(QDialogButtonBox)
    box.button(QDialogButtonBox.StandardButton.RestoreDefaults).click()
    assert conversation_dialog.overrides() == {}


# ---- themes -----------------------------------------------------------------------


def test_themes_set_palette_and_stylesheet(restore_look):
    qapp = restore_look

    windows = {}
    for name in ("light", "dark"):
        apply_theme(qapp, name)
        windows[name] = qapp.palette().color(QPalette.ColorRole.Window)
        assert "#MetricsPanel" in qapp.styleSheet()
    assert windows["light"].lightness() > 128 > windows["dark"].lightness()


def test_unknown_theme_is_refused(restore_look):
    with pytest.raises(ValueError, match="solarized"):
        apply_theme(restore_look, "solarized")
