"""Entry point of the `sprig` console script (also `python -m app`).

    sprig [MODEL.gguf] [--data-dir DIR] [--self-test] [--version]
    sprig pull owner/name[:QUANT]     (a model from Hugging Face, in the terminal: engine/hub/pull.py)

Opens the window and loads, in order of preference: the model given on the command line,
the model used last, or the bundled default. If Sprig is already running on the same
chats database, the model is handed to that window instead (app/single_instance.py).
`--data-dir` keeps the chats database and the settings in DIR instead of the per-user
folders (for tests, screenshots and portable installs). `--self-test` runs headless
checks and exits (see app/self_test.py). `--version` prints the version and the backend
`auto` picks on this machine, with why it passed the others over (a GPU left unused says why).
"""

import argparse
import sys
from pathlib import Path

from PySide6.QtWidgets import QApplication, QMessageBox

from app.file_open import FileOpenFilter
from app.main_window import MainWindow
from app.qt_libraries import check_display_libraries
from app.settings import default_settings_path, load_settings
from app.single_instance import claim_or_hand_over
from app.storage import DEFAULT_DB_NAME, StorageError, Store, default_db_path
from app.theme import app_icon
from engine.bundled import default_model


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The command line of `sprig`."""
    parser = argparse.ArgumentParser(prog="sprig", description="Chat with local language models.")
    parser.add_argument("model", nargs="?", help="a GGUF model file to add to the library and load")
    parser.add_argument("--data-dir", type=Path, help="keep chats and settings in this folder")
    parser.add_argument("--self-test", action="store_true", help="load the default model headless, check, exit")
    parser.add_argument("--version", action="store_true", help="print the version and the backend this machine gets")
    return parser.parse_args(argv)


def version_report() -> str:
    """The version, then the backend `auto` starts here and why each one before it could not run."""
    from importlib.metadata import version

    from backends.selection import select

    backend, reasons = select("auto")
    try:
        lines = [f"Sprig {version('sprig')}", f"backend: {backend.name} · {backend.device_name}"]
    finally:
        backend.close()
    passed = ["passed over:", *(f"  {reason}" for reason in reasons)] if reasons else []
    return "\n".join([*lines, *passed])


def open_store(path: Path) -> tuple[Store, str | None]:
    """The chats database, or an in-memory one with a warning if the file is unusable."""
    try:
        return Store(path), None
    except StorageError as exc:
        return Store(":memory:"), f"{exc} Chats will not be saved until this is fixed."


def model_to_open(requested: str | None, last_model: str | None) -> Path:
    """The command-line model, else the last one if it still exists, else the bundled default."""
    if requested:
        return Path(requested)
    if last_model and Path(last_model).is_file():
        return Path(last_model)
    return default_model().path


def main(argv: list[str] | None = None) -> int:
    """Open the window and run the Qt event loop."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["pull"]:  # the engine's own command, with no window
        from engine.cli import main as engine_main

        return engine_main(argv)
    args = parse_args(argv)
    if args.version:
        print(version_report())
        return 0
    if args.self_test:
        from app.self_test import run_self_test

        return run_self_test()
    existing = QApplication.instance()
    missing = None if existing else check_display_libraries()
    if missing is not None:
        print(missing.message(), file=sys.stderr)
        return 2
    app = existing if isinstance(existing, QApplication) else QApplication(sys.argv[:1])
    app.setApplicationName("Sprig")
    opened_files = FileOpenFilter(app)  # macOS passes files opened from Finder as events
    app.installEventFilter(opened_files)
    settings_path = args.data_dir / "settings.json" if args.data_dir else default_settings_path()
    db_path = args.data_dir / DEFAULT_DB_NAME if args.data_dir else default_db_path()
    if args.data_dir:
        args.data_dir.mkdir(parents=True, exist_ok=True)
    instance, refusal = claim_or_hand_over(db_path.parent, args.model)
    if instance is None:
        if refusal:
            print(refusal, file=sys.stderr)
            QMessageBox.critical(None, "Sprig is already running", refusal)
        return 1 if refusal else 0
    settings, warnings = load_settings(settings_path)
    store, store_warning = open_store(db_path)
    app.setWindowIcon(app_icon())
    window = MainWindow(store, settings, settings_path)
    window.apply_look()
    window.show()
    for warning in warnings + ([store_warning] if store_warning else []):
        window.error_banner.show_text(warning)
    instance.activated.connect(window.open_from_launch)
    opened_files.deliver_to(window.open_from_launch)
    window.add_model(str(model_to_open(args.model, settings.last_model)))
    code = app.exec()
    store.close()
    instance.release()
    return code


if __name__ == "__main__":
    sys.exit(main())
