"""The local server's settings: port, API key (in the keyring only), CORS origins, reachable from
this network (only with a key), and a curl example that follows the model and the key."""

import json
import urllib.error
import urllib.request
from dataclasses import replace

import pytest
from PySide6.QtWidgets import QApplication, QDialogButtonBox

from app.server_key import stored_key
from tests.app.conftest import close_window, load, make_window, quick_settings
from tests.gguf_factory import write_tiny_model

KEY = "s3cret-key-0042"


def get(url: str, headers: dict | None = None) -> tuple[int, dict, dict]:
    """GET `url`: status, response headers, JSON body."""
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, dict(response.headers), json.load(response)
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), json.load(exc)


@pytest.fixture
def tiny_window(qtbot, tmp_path, memory_keyring):
    """A window on a tiny model, its server on a free port (off), the keyring in memory."""
    model = write_tiny_model(tmp_path / "first.gguf", **{"qwen3.context_length": 1024})
    window = make_window(qtbot, tmp_path / "data", quick_settings(tmp_path, context_length=1024))
    load(qtbot, window, model)
    window.local_server.port = 0
    yield window
    close_window(window)


def test_the_network_is_refused_without_a_key_with_the_reason(tiny_window):
    window = tiny_window
    window.controller.settings = replace(window.controller.settings, server_network=True)
    window.menu_actions["local_server"].trigger()
    assert not window.local_server.running and not window.server_panel.switch.isChecked()
    assert "without an API key" in window.error_banner.text()


def test_a_key_opens_the_network_and_stays_out_of_the_files(qtbot, tiny_window, tmp_path):
    window = tiny_window
    dialog = window.open_server_settings()
    ok = dialog.buttons.button(QDialogButtonBox.StandardButton.Ok)
    dialog.network.setChecked(True)
    assert not ok.isEnabled() and dialog.refusal.isVisible()
    dialog.api_key.setText(KEY)
    dialog.origins.setText("http://localhost:3000, https://example.org")
    assert ok.isEnabled() and not dialog.refusal.isVisible()
    ok.click()
    assert stored_key() == KEY

    window.menu_actions["local_server"].trigger()
    server, panel = window.local_server, window.server_panel
    assert server.running and server.on_network and server.server.config.host == "0.0.0.0"
    assert "reachable from this network" in panel.address.text()
    models = f"{server.address}/models"
    assert get(models)[0] == 401
    status, headers, body = get(models, {"Authorization": f"Bearer {KEY}", "Origin": "https://example.org"})
    assert status == 200 and [m["id"] for m in body["data"]] == ["first"]
    assert headers.get("access-control-allow-origin") == "https://example.org"
    assert (
        "access-control-allow-origin" not in get(models, {"Authorization": f"Bearer {KEY}", "Origin": "https://x.y"})[1]
    )

    assert KEY not in panel.curl.text() and "Authorization: Bearer ••••" in panel.curl.text()
    panel.copy_button.click()
    assert f"Authorization: Bearer {KEY}" in QApplication.clipboard().text()

    window.close()
    for written in (tmp_path / "data").iterdir():
        assert KEY.encode() not in written.read_bytes(), written  # settings, history and its journal


def test_the_curl_example_follows_the_loaded_model(qtbot, tiny_window, tmp_path):
    window = tiny_window
    window.menu_actions["local_server"].trigger()
    assert '"model": "first"' in window.server_panel.curl.text()
    assert "Authorization" not in window.server_panel.curl.text()  # no key, no header
    load(qtbot, window, write_tiny_model(tmp_path / "second.gguf", seed=3, **{"qwen3.context_length": 1024}))
    assert '"model": "second"' in window.server_panel.curl.text()
    assert get(f"{window.local_server.address}/models")[2]["data"][0]["id"] == "second"


def test_the_port_comes_from_the_settings(tiny_window):
    window = tiny_window
    window.local_server.port = None
    window.controller.settings = replace(window.controller.settings, server_port=18_431)
    window.menu_actions["local_server"].trigger()
    assert window.local_server.address == "http://127.0.0.1:18431/v1"
