"""Where the window opens and how big: it fits the screen it opens on, frame included.

The first window takes DEFAULT_SIZE, or less where the screen's free area (without
panels and docks) minus the window manager's frame is smaller. The frame is known only
once the window manager has decorated the window, so the size is checked again then
(`fit_frame`). Later starts restore the size, place and maximised state saved at closing
(`saved_geometry` / `restore_geometry`, as base64 text in the settings).
"""

from PySide6.QtCore import QByteArray, QMargins, QRect, QSize
from PySide6.QtWidgets import QWidget

DEFAULT_SIZE = QSize(1280, 800)  # the window's size on a screen with room for it
FRAME_GUESS = QMargins(2, 32, 2, 2)  # a typical title bar and border, until the real frame is known


def fitted_rect(available: QRect, frame: QMargins, preferred: QSize = DEFAULT_SIZE) -> QRect:
    """The client area of a window of `preferred` size whose frame fits inside `available`.

    The window is placed at its frame's top-left corner of `available`, centred where there is room.
    """
    width = min(preferred.width(), available.width() - frame.left() - frame.right())
    height = min(preferred.height(), available.height() - frame.top() - frame.bottom())
    outer_width = width + frame.left() + frame.right()
    outer_height = height + frame.top() + frame.bottom()
    left = available.left() + (available.width() - outer_width) // 2 + frame.left()
    top = available.top() + (available.height() - outer_height) // 2 + frame.top()
    return QRect(left, top, width, height)


def frame_margins(window: QWidget) -> QMargins:
    """The window manager's frame around `window` (zero before it is decorated, or without one)."""
    outer, inner = window.frameGeometry(), window.geometry()
    return QMargins(
        inner.left() - outer.left(),
        inner.top() - outer.top(),
        outer.right() - inner.right(),
        outer.bottom() - inner.bottom(),
    )


def place_first_window(window: QWidget) -> None:
    """Size and place a window that has no saved geometry, guessing the frame."""
    screen = window.screen()
    if screen is not None:
        window.setGeometry(fitted_rect(screen.availableGeometry(), FRAME_GUESS))


def fit_frame(window: QWidget) -> bool:
    """Shrink and move a shown, normal window whose frame spills off its screen's free area.

    Returns True if it changed anything.
    """
    screen = window.screen()
    if screen is None or window.isMaximized() or window.isFullScreen():
        return False
    available = screen.availableGeometry()
    if available.contains(window.frameGeometry()):
        return False
    window.setGeometry(fitted_rect(available, frame_margins(window), window.size()))
    return True


def saved_geometry(window: QWidget) -> str:
    """The window's geometry and maximised state, as text for the settings file."""
    return bytes(window.saveGeometry().toBase64().data()).decode("ascii")


def restore_geometry(window: QWidget, text: str | None) -> bool:
    """Give `window` the geometry of `saved_geometry`'s `text`; False if there is none or it is unreadable."""
    if not text:
        return False
    return window.restoreGeometry(QByteArray.fromBase64(text.encode("ascii", errors="replace")))
