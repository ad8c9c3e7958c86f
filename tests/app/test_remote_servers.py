"""Settings → Models: a server is edited (name, address, key, self-signed) or removed, and everything follows:
the store, the keyring, the model picker, the model answering, and the chats that named its models."""

import pytest
from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication, QDialogButtonBox, QMessageBox

from app.widgets.remote_models import RemoteModels
from app.widgets.server_form import AddServerDialog
from app.widgets.settings_dialog import SettingsDialog
from engine.keyring_store import SERVICE
from engine.model_uri import parse_model_uri
from engine.remote import keys
from engine.remote.endpoints import Endpoint
from tests.app.conftest import answer, close_window, load, make_window, quick_settings
from tests.engine.remote.faulty_server import FaultyServer
from tests.gguf_factory import write_tiny_model


@pytest.fixture
def window(qtbot, tmp_path, memory_keyring):
    win = make_window(qtbot, tmp_path / "data", quick_settings(tmp_path))
    yield win
    close_window(win)


@pytest.fixture
def faulty():
    server = FaultyServer()
    yield server
    server.close()


def chat_with(qtbot, window, endpoint: Endpoint, key: str) -> int:
    """Keep `endpoint` (its key in the keyring), answer one message with its model "m"; the chat's id."""
    window.store.save_endpoint(endpoint)
    keys.save_api_key(endpoint.base_url, key)
    assert window.controller.models.use_remote(endpoint, "m")
    assert answer(qtbot, window, lambda: window.controller.send("What is 2 + 2?"))[1] == "complete"
    return window.controller.conversation.id


def when_shown(kind: type, act) -> None:
    """Run `act(dialog)` once a modal dialog of `kind` is up (it is opened right after this call)."""

    def attempt() -> None:
        dialog = QApplication.activeModalWidget()
        if isinstance(dialog, kind):
            act(dialog)
        else:
            QTimer.singleShot(10, attempt)

    QTimer.singleShot(0, attempt)


def in_settings(window, act) -> None:
    """Open Settings and run `act(dialog)` in it, then close it."""
    done = []

    def run(dialog: SettingsDialog) -> None:
        try:
            act(dialog)
        finally:
            dialog.reject()
            done.append(True)

    when_shown(SettingsDialog, run)
    window.open_settings()
    assert done


def server_lines(dialog: SettingsDialog) -> list[str]:
    servers = dialog.servers.list
    return [servers.item(row).text() for row in range(servers.count())]


def test_editing_a_server_moves_its_key_its_chats_and_the_model_answering(qtbot, window, faulty, memory_keyring):
    old = Endpoint("Box", faulty.url("think"))
    conversation = chat_with(qtbot, window, old, "sk-old")
    picker = window.open_model_picker()
    remote = picker.findChild(RemoteModels)
    new_url = faulty.url("reasoning")
    seen = {}

    def edit(dialog: SettingsDialog) -> None:
        assert server_lines(dialog) == [f"Box — {old.base_url}"]
        assert not dialog.servers.edit_button.isEnabled()  # nothing chosen yet
        dialog.servers.select("Box")
        when_shown(AddServerDialog, fill_in)
        dialog.servers.edit_button.click()
        seen["after"] = server_lines(dialog)

    def fill_in(form: AddServerDialog) -> None:
        seen["form"] = (form.windowTitle(), form.name.text(), form.base_url.text(), form.key.text())
        form.name.setText("GPU box")
        form.base_url.setText(new_url)
        form.key.setText("sk-new")
        form.self_signed.setChecked(True)
        form.findChild(QDialogButtonBox).button(QDialogButtonBox.StandardButton.Ok).click()

    in_settings(window, edit)
    assert seen["form"] == ("Edit “Box”", "Box", old.base_url, "sk-old")  # it starts from the server as it was
    assert seen["after"] == [f"GPU box — {new_url}"]
    assert window.store.endpoints() == [Endpoint("GPU box", new_url, verify_tls=False)]
    assert memory_keyring.saved == {(SERVICE, f"server:{new_url}"): "sk-new"}  # the old address's key is gone
    ref = parse_model_uri(window.store.conversation(conversation).model_uri)
    assert (ref.base_url, ref.model_id) == (new_url, "m")  # the chat follows its server
    assert remote.tree.topLevelItem(0).text(0) == f"GPU box — {new_url}"  # the open picker too
    assert window.controller.chat_engine.describe().where == "GPU box"
    assert answer(qtbot, window, lambda: window.controller.send("And 3 + 1?"))[1] == "complete"
    assert window.store.messages(conversation)[-1].content.endswith("The answer is 4.")  # from the edited address
    picker.close()


def test_removing_a_server_forgets_it_and_its_key_and_its_chats_say_so(qtbot, window, faulty, memory_keyring):
    endpoint = Endpoint("Box", faulty.url("think"))
    conversation = chat_with(qtbot, window, endpoint, "sk-box")
    window.store.save_endpoint(Endpoint("Other", faulty.url("reasoning")))
    picker = window.open_model_picker()
    remote = picker.findChild(RemoteModels)
    assert remote.tree.topLevelItemCount() == 2
    seen = {}

    def remove(dialog: SettingsDialog) -> None:
        dialog.servers.select("Box")
        when_shown(QMessageBox, confirm)
        dialog.servers.remove_button.click()
        seen["after"] = server_lines(dialog)

    def confirm(box: QMessageBox) -> None:
        seen["question"] = box.text()
        box.button(QMessageBox.StandardButton.Yes).click()

    in_settings(window, remove)
    assert "“Box”" in seen["question"] and "keyring" in seen["question"]
    assert seen["after"] == [f"Other — {faulty.url('reasoning')}"]
    assert [e.name for e in window.store.endpoints()] == ["Other"]
    assert memory_keyring.saved == {}  # its key left the keyring
    assert [remote.tree.topLevelItem(i).text(0) for i in range(remote.tree.topLevelItemCount())] == [
        f"Other — {faulty.url('reasoning')}"
    ]  # its models left the picker
    assert window.controller.chat_engine is None  # its model answered; now nothing does
    picker.close()

    window.new_conversation()
    window.controller.open_conversation(conversation)  # still readable
    assert window.chat_view.has_messages()
    assert [m.role for m in window.store.messages(conversation)] == ["user", "assistant"]
    assert not window.controller.send("Go on")
    assert "was on a server that has been removed" in window.error_banner.text()
    assert faulty.url("think") in window.error_banner.text()
    assert not window.controller.regenerate()
    assert len(window.store.messages(conversation)) == 2  # nothing was added


def test_a_removal_not_confirmed_keeps_the_server(qtbot, window, faulty, memory_keyring):
    endpoint = Endpoint("Box", faulty.url("think"))
    window.store.save_endpoint(endpoint)
    keys.save_api_key(endpoint.base_url, "sk-box")

    def remove(dialog: SettingsDialog) -> None:
        dialog.servers.select("Box")
        when_shown(QMessageBox, lambda box: box.button(QMessageBox.StandardButton.No).click())
        dialog.servers.remove_button.click()

    in_settings(window, remove)
    assert window.store.endpoints() == [endpoint]
    assert memory_keyring.saved == {(SERVICE, f"server:{endpoint.base_url}"): "sk-box"}


def test_choosing_a_remote_model_lets_the_local_one_go(qtbot, window, faulty, tmp_path):
    load(qtbot, window, write_tiny_model(tmp_path / "tiny.gguf"))
    assert window.controller.loaded is not None
    with qtbot.waitSignal(window.controller.busy_changed, check_params_cb=lambda busy: not busy, timeout=20_000):
        assert window.controller.models.use_remote(Endpoint("Box", faulty.url("think")), "m")
    assert window.controller.loaded is None and window.controller.models.scheduler is None  # released
    assert window.controller.chat_engine.describe().where == "Box"
    assert window.model_bar.model_button.full_text().startswith("m — Box")
    assert answer(qtbot, window, lambda: window.controller.send("What is 2 + 2?"))[1] == "complete"
