"""The window fits the screen it opens on, frame included, and reopens as it was closed."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from PySide6.QtCore import QMargins, QRect, QSize

from app.settings import Settings, load_settings
from app.window_geometry import fitted_rect
from tests.app.conftest import close_window, make_window

DRIVER = Path(__file__).with_name("window_frame_driver.py")
REPO = DRIVER.parents[2]


def inside(outer: list[int], inner: list[int]) -> bool:
    """Whether rectangle `inner` ([x, y, w, h]) lies within `outer`."""
    return (
        inner[0] >= outer[0]
        and inner[1] >= outer[1]
        and inner[0] + inner[2] <= outer[0] + outer[2]
        and inner[1] + inner[3] <= outer[1] + outer[3]
    )


@pytest.mark.parametrize("screen", [(1366, 768), (1280, 720), (1920, 1080)])
def test_the_frame_fits_a_real_window_manager(tmp_path, screen):
    if not (shutil.which("xvfb-run") and shutil.which("openbox")):
        pytest.skip("needs Xvfb and a window manager: apt-get install xvfb openbox libxcb-cursor0 libxcb-icccm4 "
                    "libxcb-keysyms1 libxkbcommon-x11-0")
    command = f"openbox >/dev/null 2>&1 & sleep 1; {sys.executable} {DRIVER} {tmp_path}"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("QT_QPA_PLATFORM", None)
    result = subprocess.run(
        ["xvfb-run", "-a", "-s", f"-screen 0 {screen[0]}x{screen[1]}x24", "sh", "-c", command],
        capture_output=True, text=True, timeout=180, env=env,
    )
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["frame"][3] > report["client"][3]  # the window manager did draw a title bar
    assert inside(report["available"], report["frame"]), report
    assert inside(report["available"], report["send"]) and inside(report["available"], report["import"]), report
    if screen == (1920, 1080):
        assert report["client"][2:] == [1280, 800]  # room to spare: the preferred size, not the whole screen


def test_fitted_rect_keeps_frame_and_panels_on_screen():
    available = QRect(0, 28, 1366, 740)  # a 28 px top panel on 1366×768
    frame = QMargins(1, 20, 1, 1)
    rect = fitted_rect(available, frame, QSize(1280, 800))
    assert rect.size() == QSize(1280, 740 - 21)
    outer = rect.adjusted(-frame.left(), -frame.top(), frame.right(), frame.bottom())
    assert available.contains(outer)
    roomy = fitted_rect(QRect(0, 0, 1920, 1080), frame, QSize(1280, 800))
    assert roomy.size() == QSize(1280, 800)
    assert roomy.center().x() in range(959, 962)  # centred


def test_size_and_maximised_state_come_back_after_a_restart(qtbot, tmp_path):
    data = tmp_path / "data"
    window = make_window(qtbot, data, Settings.defaults())
    window.resize(780, 520)
    qtbot.waitUntil(lambda: window.size() == QSize(780, 520))
    close_window(window)
    settings, warnings = load_settings(data / "settings.json")
    assert warnings == [] and settings.window_geometry

    again = make_window(qtbot, data, settings)
    assert again.size() == QSize(780, 520)
    again.showMaximized()
    qtbot.waitUntil(again.isMaximized)
    close_window(again)

    third = make_window(qtbot, data, load_settings(data / "settings.json")[0])
    qtbot.waitUntil(third.isMaximized)
    close_window(third)


def test_an_unreadable_saved_geometry_falls_back_to_fitting_the_screen(qtbot, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "settings.json").write_text(json.dumps({"window_geometry": "not a geometry at all"}))
    settings, _warnings = load_settings(data / "settings.json")
    window = make_window(qtbot, data, settings)
    available = window.screen().availableGeometry()
    assert window.width() <= available.width() and window.height() <= available.height()
    assert window.width() > 0 and window.height() > 0
    close_window(window)
