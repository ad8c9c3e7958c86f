"""The desktop entry, the MIME type and the AppStream file, checked by their own validators."""

import os
import shutil
import subprocess
import sys

from engine.bundled import default_model
from tests.packaging.conftest import LINUX, REPO, require_tools

DESKTOP = LINUX / "org.sprig.Sprig.desktop"
MIME = LINUX / "org.sprig.Sprig-gguf.xml"
METAINFO = LINUX / "org.sprig.Sprig.metainfo.xml"


def test_desktop_entry_passes_desktop_file_validate_and_opens_gguf_files():
    require_tools({"desktop-file-validate": "desktop-file-utils"})
    result = subprocess.run(["desktop-file-validate", str(DESKTOP)], capture_output=True, text=True)
    assert result.returncode == 0 and not result.stdout.strip(), result.stdout + result.stderr
    entry = dict(line.split("=", 1) for line in DESKTOP.read_text().splitlines() if "=" in line)
    assert entry["Exec"] == "sprig %f"  # one file per launch, handed to a running Sprig
    assert "application/x-gguf" in entry["MimeType"].split(";")


def test_appstream_metainfo_passes_appstreamcli_validate():
    require_tools({"appstreamcli": "appstream"})
    result = subprocess.run(["appstreamcli", "validate", "--no-net", str(METAINFO)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_gguf_files_are_recognised_by_name_and_by_content(tmp_path):
    require_tools({"update-mime-database": "shared-mime-info"})
    mime_dir = tmp_path / "share" / "mime"
    (mime_dir / "packages").mkdir(parents=True)
    shutil.copy(MIME, mime_dir / "packages")
    env = {
        **os.environ,
        "XDG_DATA_DIRS": str(tmp_path / "share"),
        "XDG_DATA_HOME": str(tmp_path / "none"),
        "QT_QPA_PLATFORM": "offscreen",
    }
    result = subprocess.run(["update-mime-database", str(mime_dir)], env=env, capture_output=True, text=True)
    assert result.returncode == 0 and not result.stderr.strip(), result.stderr
    assert "application/x-gguf:*.gguf" in (mime_dir / "globs2").read_text()
    renamed = tmp_path / "model-without-extension"
    renamed.write_bytes(default_model().path.read_bytes()[:4096])  # starts with the magic "GGUF"
    text = tmp_path / "notes.txt"
    text.write_text("not a model\n")
    # Qt reads the freedesktop MIME database as any desktop does: ask it, in a process that
    # sees only the database built above.
    probe = (
        "import sys\nfrom PySide6.QtCore import QMimeDatabase\n"
        "for p in sys.argv[1:]: print(QMimeDatabase().mimeTypeForFile(p).name())"
    )
    found = subprocess.run(
        [sys.executable, "-c", probe, str(default_model().path), str(renamed), str(text)],
        env=env,
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert found.stdout.split() == ["application/x-gguf", "application/x-gguf", "text/plain"], found.stderr
