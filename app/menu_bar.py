"""The window's menu bar: every command in one place, with its shortcut, and the Help sheet.

The keyboard-shortcuts sheet (F1) is made from these same actions, so it cannot drift
from what the keys really do. The menu knows the window only as a `MenuHost`: the commands
it calls (`app.main_window.MainWindow` is one).
"""

import platform
from collections.abc import Callable
from importlib import metadata
from typing import Protocol

import PySide6
from PySide6.QtCore import qVersion
from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import QMenuBar, QMessageBox, QWidget

from app.chat_controller import ChatController
from app.widgets.model_bar import ModelBar

ABOUT = (
    "<b>Sprig {version}</b><br>A desktop chat app for local language models, on an inference engine "
    "of its own. Models run on this computer; nothing is sent anywhere.<br><br>"
    "Python {python} · Qt {qt} · PySide6 {pyside}"
)


def sprig_version() -> str:
    """The installed distribution's version ("unknown" when run from sources that were never installed)."""
    try:
        return metadata.version("sprig")
    except metadata.PackageNotFoundError:
        return "(version unknown: not installed)"


def about_text() -> str:
    """The About box: Sprig's version and those of what it runs on."""
    return ABOUT.format(
        version=sprig_version(), python=platform.python_version(), qt=qVersion(), pyside=PySide6.__version__
    )


TEXT_STEP = 10  # percent per Larger / Smaller text

# Keys handled by widgets themselves rather than by menu actions.
WIDGET_KEYS = (
    ("Enter", "Send the message"),
    ("Shift+Enter", "New line in the message"),
    ("F2", "Rename the selected chat (or double-click it)"),
)


class MenuHost(Protocol):
    """The window whose menu bar `build_menu_bar` fills: the commands its entries run."""

    @property
    def controller(self) -> ChatController:
        """The chat controller (unload, continue, stop)."""
        ...

    @property
    def model_bar(self) -> ModelBar:
        """The model bar, whose Metrics button the View menu's entry mirrors."""
        ...

    def menuBar(self) -> QMenuBar:
        """The window's menu bar."""
        ...

    def close(self) -> bool:
        """Close the window (File > Quit)."""
        ...

    def new_conversation(self) -> object:
        """Start a new chat."""
        ...

    def import_conversation(self) -> object:
        """Import a chat from a file."""
        ...

    def open_settings(self) -> object:
        """Open the app's settings."""
        ...

    def open_model_picker(self) -> object:
        """Open the model picker."""
        ...

    def open_get_models(self) -> object:
        """Open Get models."""
        ...

    def open_model_settings(self) -> object:
        """Open the current model's settings."""
        ...

    def toggle_local_server(self) -> object:
        """Start or stop the local server."""
        ...

    def open_conversation_settings(self) -> object:
        """Open the current chat's settings."""
        ...

    def open_adapters(self) -> object:
        """Open the current chat's adapters."""
        ...

    def show_completion(self, on: bool) -> object:
        """Show the completion view (on) or the chat (off)."""
        ...

    def change_text_size(self, step: int) -> object:
        """Make the text `step` percent larger (0: back to the actual size)."""
        ...


def add_action(menu, text: str, handler: Callable, keys: str = "") -> QAction:
    """A menu entry running `handler`, with its shortcut `keys` (if any)."""
    action = QAction(text, menu)
    if keys:
        action.setShortcut(QKeySequence(keys))
    action.triggered.connect(lambda _checked=False: handler())
    menu.addAction(action)
    return action


def build_menu_bar(window: MenuHost) -> dict[str, QAction]:
    """Fill `window`'s menu bar and return its actions by short name."""
    bar = window.menuBar()
    actions: dict[str, QAction] = {}
    file_menu = bar.addMenu("&File")
    actions["new"] = add_action(file_menu, "&New chat", window.new_conversation, "Ctrl+N")
    actions["import"] = add_action(file_menu, "&Import chat…", window.import_conversation)
    actions["settings"] = add_action(file_menu, "&Settings…", window.open_settings, "Ctrl+,")
    file_menu.addSeparator()
    actions["quit"] = add_action(file_menu, "&Quit", window.close, "Ctrl+Q")

    model_menu = bar.addMenu("&Model")
    actions["choose_model"] = add_action(model_menu, "&Choose model…", window.open_model_picker, "Ctrl+L")
    actions["get_models"] = add_action(model_menu, "&Get models…", window.open_get_models, "Ctrl+Shift+L")
    actions["model_settings"] = add_action(model_menu, "Model &settings…", window.open_model_settings)
    actions["unload"] = add_action(model_menu, "&Unload", window.controller.models.unload)
    actions["local_server"] = add_action(model_menu, "Local &server", window.toggle_local_server)
    actions["local_server"].setCheckable(True)

    chat_menu = bar.addMenu("&Chat")
    actions["chat_settings"] = add_action(chat_menu, "Chat &settings…", window.open_conversation_settings)
    actions["adapters"] = add_action(chat_menu, "&Adapters…", window.open_adapters)
    actions["continue"] = add_action(
        chat_menu, "&Continue the answer", window.controller.continue_answer, "Ctrl+Shift+Return"
    )
    actions["stop"] = add_action(chat_menu, "S&top", window.controller.cancel, "Escape")

    view_menu = bar.addMenu("&View")
    actions["metrics"] = add_action(view_menu, "&Metrics panel", lambda: None, "Ctrl+M")
    actions["metrics"].setCheckable(True)
    actions["metrics"].setChecked(True)
    actions["metrics"].toggled.connect(window.model_bar.metrics_button.setChecked)
    window.model_bar.metrics_button.toggled.connect(actions["metrics"].setChecked)
    actions["completion"] = add_action(view_menu, "&Completion view", lambda: None)
    actions["completion"].setCheckable(True)
    actions["completion"].setToolTip("Let the model continue a text of yours, as base models are made for")
    actions["completion"].triggered.connect(window.show_completion)
    view_menu.addSeparator()
    actions["larger"] = add_action(view_menu, "&Larger text", lambda: window.change_text_size(TEXT_STEP), "Ctrl++")
    actions["larger"].setShortcuts([QKeySequence("Ctrl++"), QKeySequence("Ctrl+=")])
    actions["smaller"] = add_action(view_menu, "&Smaller text", lambda: window.change_text_size(-TEXT_STEP), "Ctrl+-")
    actions["text_reset"] = add_action(view_menu, "&Actual size", lambda: window.change_text_size(0), "Ctrl+0")

    help_menu = bar.addMenu("&Help")
    sheet_parent = bar.window()  # the window itself, as a widget
    actions["shortcuts"] = add_action(
        help_menu, "&Keyboard shortcuts", lambda: show_shortcuts(sheet_parent, actions), "F1"
    )
    actions["about"] = add_action(help_menu, "&About Sprig", lambda: show_about(sheet_parent))
    return actions


def show_about(window: QWidget) -> QMessageBox:
    """Show the About box (non-modal, like the shortcuts sheet); returns it."""
    box = QMessageBox(QMessageBox.Icon.NoIcon, "About Sprig", about_text(), QMessageBox.StandardButton.Close, window)
    box.setModal(False)
    box.show()
    return box


def shortcuts_text(actions: dict[str, QAction]) -> str:
    """The shortcuts sheet as an HTML table: every action with a shortcut, then the widget keys."""
    rows = [
        (a.shortcut().toString(QKeySequence.SequenceFormat.NativeText), a.text().replace("&", ""))
        for a in actions.values()
        if not a.shortcut().isEmpty()
    ]
    rows += list(WIDGET_KEYS)
    cells = "".join(f"<tr><td><b>{keys}</b>&nbsp;&nbsp;</td><td>{what}</td></tr>" for keys, what in rows)
    return f"<table>{cells}</table>"


def show_shortcuts(window: QWidget, actions: dict[str, QAction]) -> QMessageBox:
    """Show the keyboard-shortcuts sheet (non-modal); returns it."""
    box = QMessageBox(
        QMessageBox.Icon.NoIcon, "Keyboard shortcuts", shortcuts_text(actions), QMessageBox.StandardButton.Close, window
    )
    box.setModal(False)
    box.show()
    return box
