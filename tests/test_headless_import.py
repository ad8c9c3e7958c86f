"""engine and backends import where Qt cannot, as in napari's headless test environment.

The AST walk in test_import_rules.py sees each module's own imports only; this imports
every module for real, in a fresh interpreter where importing any Qt binding fails, so
an import that reaches Qt through another module fails too.
"""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import importlib, importlib.abc, json, pkgutil, sys

QT = {"PySide6", "shiboken6", "PyQt5", "PyQt6", "PySide2", "qtpy", "pytestqt"}
MARK = "headless: Qt is not importable here"

class NoQt(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in QT:
            raise ImportError(f"{MARK} ({name})")
        return None

sys.meta_path.insert(0, NoQt())
result = {"imported": [], "qt": {}, "other": {}}
names = [info.name for package in ("engine", "backends")
         for info in pkgutil.walk_packages(importlib.import_module(package).__path__, package + ".")
         # __main__ would run the command line; the kernel builds (one per instruction set)
         # are cpu_native's to choose: one for a CPU this one is not would stop it (SIGILL).
         if not info.name.endswith(".__main__") and not info.name.startswith("backends._cpu_")]
for name in ["engine", "backends", *names]:
    try:
        importlib.import_module(name)
        result["imported"].append(name)
    except ImportError as exc:
        result["qt" if MARK in str(exc) else "other"][name] = str(exc)
try:
    importlib.import_module("app.main_window")
    result["app_imported"] = True
except ImportError as exc:
    result["app_imported"] = MARK not in str(exc)
print(json.dumps(result))
"""


def test_engine_and_backends_import_without_qt():
    done = subprocess.run([sys.executable, "-c", CHILD], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["app_imported"] is False, "the Qt block did not work: app.main_window imported"
    assert not result["qt"], f"these modules need Qt: {result['qt']}"
    # What the CLI and the server run on must be there, whatever optional backend is missing.
    for needed in ("engine.loader", "engine.cli", "engine.chat_session", "backends.selection", "backends.numpy_backend"):
        assert needed in result["imported"], result["other"].get(needed)
    if result["other"]:
        print(f"modules that need an optional package not installed here: {result['other']}")
