"""The dependency direction app -> engine -> backends, enforced by walking every import."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
QT_PACKAGES = {"PySide6", "PyQt5", "PyQt6", "PySide2", "shiboken6", "pytestqt", "qtpy"}


def imported_top_levels(package: str) -> dict[str, set[str]]:
    """Map each module file of `package` to the top-level names it imports."""
    found: dict[str, set[str]] = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                names.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
            elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) in {"import_module", "__import__"}:
                if node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
                    names.add(node.args[0].value.split(".")[0])
        found[str(path.relative_to(ROOT))] = names
    return found


@pytest.mark.parametrize("package", ["engine", "backends"])
def test_core_packages_never_import_qt(package):
    offenders = {f: n & QT_PACKAGES for f, n in imported_top_levels(package).items() if n & QT_PACKAGES}
    assert not offenders, f"{package} must stay Qt-free: {offenders}"


def test_backends_never_import_engine_or_app():
    offenders = {f: n & {"engine", "app"} for f, n in imported_top_levels("backends").items() if n & {"engine", "app"}}
    assert not offenders, f"backends must not depend on engine or app: {offenders}"


def test_engine_never_imports_app():
    offenders = [f for f, n in imported_top_levels("engine").items() if "app" in n]
    assert not offenders, f"engine must not depend on app: {offenders}"


def test_the_walk_sees_imports(tmp_path, monkeypatch):
    """Guard against a walker that silently finds nothing: app does import Qt."""
    assert any(n & QT_PACKAGES for n in imported_top_levels("app").values())
