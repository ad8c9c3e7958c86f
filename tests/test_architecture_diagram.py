"""docs/architecture.md's diagram is what tools/checks/architecture_diagram.py draws from the
code now, and the script draws rooms and arrows as the imports say."""

from tools.checks.architecture_diagram import DOC, committed, mermaid, render, rooms_and_arrows


def test_the_committed_diagram_is_current():
    assert committed(DOC.read_text(encoding="utf-8")) == render(), (
        "docs/architecture.md's diagram is stale: run `.venv/bin/python -m tools.checks.architecture_diagram`"
    )


def test_the_diagram_shows_the_rooms_and_the_direction():
    rooms, arrows = rooms_and_arrows()
    for room in ("backends/cuda", "engine/vision", "engine/tools", "engine/documents", "engine/models"):
        assert room in rooms
    assert "engine/server/openai" in rooms  # a protocol: it defines router()
    assert ("app", "engine") in arrows and ("engine/models", "backends") in arrows
    assert not [arrow for arrow in arrows if arrow[0].startswith("backends") and not arrow[1].startswith("backends")]


def _write(root, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_rooms_and_arrows_of_a_small_tree(tmp_path):
    """Subpackages are rooms (with what lies below them), a server module with `router` is a
    protocol room, the rest of a floor is the floor's room; imports become arrows between
    rooms, none inside one."""
    _write(
        tmp_path,
        {
            "app/__init__.py": "",
            "app/main.py": "from engine.models import Model\nfrom app.widgets import view\n",
            "app/widgets/__init__.py": "",
            "app/widgets/view.py": "import app.main\n",
            "engine/__init__.py": "",
            "engine/config.py": "",
            "engine/models/__init__.py": "from engine.models.deep.block import Block\nclass Model: ...\n",
            "engine/models/deep/__init__.py": "",
            "engine/models/deep/block.py": "from engine.config import x\nfrom backends.base import Backend\n",
            "engine/server/__init__.py": "",
            "engine/server/app.py": "from engine.server import openai\n",
            "engine/server/openai.py": "from engine.server.scheduler import run\ndef router(state): ...\n",
            "engine/server/scheduler.py": "",
            "engine/vision/__init__.py": '"""Empty yet."""\n',
            "backends/__init__.py": "",
            "backends/base.py": "",
        },
    )
    rooms, arrows = rooms_and_arrows(tmp_path)
    assert rooms == [
        "app",
        "app/widgets",
        "backends",
        "engine",
        "engine/models",
        "engine/server",
        "engine/server/openai",
        "engine/vision",
    ]
    assert arrows == {
        ("app", "engine/models"),
        ("app", "app/widgets"),
        ("app/widgets", "app"),
        ("engine/models", "engine"),
        ("engine/models", "backends"),
        ("engine/server", "engine/server/openai"),
        ("engine/server/openai", "engine/server"),
    }
    diagram = mermaid(rooms, arrows)
    assert '        engine_vision["engine/vision/"]' in diagram  # an empty room is drawn
    assert '        engine_server_openai["server protocol: openai"]' in diagram
    assert "    engine_models --> backends" in diagram
