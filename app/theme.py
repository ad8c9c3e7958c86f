"""Light and dark looks: the Fusion style, a palette, and a stylesheet from resources/.

The palette colours every widget, styled or not; the stylesheets (`light.qss`,
`dark.qss`) add the rounded inputs, the accent colour, the focus rings, the checkboxes and
the panels addressed by objectName (#Sidebar, #ChatView, #MessageInput, #SendButton,
#MetricsPanel, #ModelBar, #ErrorBanner, #InfoBanner, MessageWidget[role="user"|"assistant"]).
In them `{RESOURCES}` stands for the folder of their images. "system" follows the
desktop's light or dark scheme.
"""

import re

from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QGuiApplication, QIcon, QPalette
from PySide6.QtWidgets import QApplication

from app.settings import RESOURCES, THEMES

Role = QPalette.ColorRole

# Active colours per role; the disabled text roles get `disabled` below.
_COLOURS: dict[str, dict[QPalette.ColorRole, str]] = {
    "light": {
        Role.Window: "#f5f6f8",
        Role.WindowText: "#1c2230",
        Role.Base: "#ffffff",
        Role.AlternateBase: "#eef1f4",
        Role.Text: "#1c2230",
        Role.PlaceholderText: "#8a93a3",
        Role.Button: "#ffffff",
        Role.ButtonText: "#1c2230",
        Role.BrightText: "#ffffff",
        Role.Highlight: "#2e9d6a",
        Role.HighlightedText: "#ffffff",
        Role.Link: "#1f7a52",
        Role.ToolTipBase: "#1c2230",
        Role.ToolTipText: "#f5f6f8",
        Role.Light: "#ffffff",
        Role.Midlight: "#e4e7ec",
        Role.Mid: "#c8cdd5",
        Role.Dark: "#9aa1ad",
        Role.Shadow: "#5b6270",
    },
    "dark": {
        Role.Window: "#1d2025",
        Role.WindowText: "#e4e7eb",
        Role.Base: "#15171b",
        Role.AlternateBase: "#23272d",
        Role.Text: "#e4e7eb",
        Role.PlaceholderText: "#7c8490",
        Role.Button: "#2a2e35",
        Role.ButtonText: "#e4e7eb",
        Role.BrightText: "#ffffff",
        Role.Highlight: "#3cba80",
        Role.HighlightedText: "#0c1a13",
        Role.Link: "#5fd39d",
        Role.ToolTipBase: "#e4e7eb",
        Role.ToolTipText: "#1d2025",
        Role.Light: "#3a3f47",
        Role.Midlight: "#30353c",
        Role.Mid: "#3f444d",
        Role.Dark: "#111316",
        Role.Shadow: "#000000",
    },
}
_DISABLED_TEXT = {"light": "#a3a9b4", "dark": "#6a717c"}


def build_palette(name: str) -> QPalette:
    """The QPalette of theme `name` ("light" or "dark"), disabled text greyed."""
    palette = QPalette()
    for role, colour in _COLOURS[name].items():
        palette.setColor(role, QColor(colour))
    disabled = QColor(_DISABLED_TEXT[name])
    for role in (Role.WindowText, Role.Text, Role.ButtonText, Role.HighlightedText):
        palette.setColor(QPalette.ColorGroup.Disabled, role, disabled)
    return palette


def app_icon() -> QIcon:
    """Sprig's icon (a sprig on a green tile), for the app and its windows."""
    return QIcon(str(RESOURCES / "sprig.svg"))


def system_is_dark() -> bool:
    """Whether the desktop asks for dark colours."""
    return QGuiApplication.styleHints().colorScheme() == Qt.ColorScheme.Dark


def resolve_theme(name: str) -> str:
    """ "light" or "dark": `name` itself, or for "system" the desktop's colour scheme."""
    if name != "system":
        return name
    return "dark" if system_is_dark() else "light"


# Text drawn smaller or larger than the rest, in proportion to the text size (see `relative_sizes`).
SMALL_TEXT = 0.9  # secondary text: a message's model, status, figures and action buttons
LARGE_TEXT = 1.3  # the empty chat's hint
_FONT_SIZE = re.compile(r"font-size:\s*([0-9.]+)pt")


def base_point_size(app: QApplication) -> float:
    """The app font's size before any text scaling (remembered at the first call)."""
    base = app.property("sprig_base_point_size")
    if base is None:
        base = app.font().pointSizeF()
        app.setProperty("sprig_base_point_size", base)
    return float(base)


def scaled_stylesheet(sheet: str, percent: int, base_pt: float) -> str:
    """`sheet` with every point size scaled to `percent`, and the relative text sizes for `base_pt` at `percent`."""
    scaled = _FONT_SIZE.sub(lambda m: f"font-size: {float(m.group(1)) * percent / 100:.1f}pt", sheet)
    return scaled + relative_sizes(base_pt * percent / 100)


def relative_sizes(point_size: float) -> str:
    """Stylesheet rules for the text drawn smaller or larger than `point_size`, the body text's size."""
    small, large = point_size * SMALL_TEXT, point_size * LARGE_TEXT
    return (
        f"\n#MessageModel, #MessageStatus, #MessageDetails, QToolButton#MessageAction {{ font-size: {small:.1f}pt; }}"
        f"\n#ChatPlaceholder {{ font-size: {large:.1f}pt; }}\n"
    )


def apply_theme(app: QApplication, name: str, text_scale: int = 100) -> str:
    """Give the whole app theme `name` at `text_scale` percent of the system's text size.

    The font is set first and the stylesheet after it, so that every widget is polished
    once, at the new size: menus, sidebar, buttons and panels change with the messages.
    Returns the look applied, "light" or "dark" ("system" resolves to one of them).
    Raises ValueError for a name not in app.settings.THEMES.
    """
    if name not in THEMES:
        raise ValueError(f"unknown theme {name!r}; choose one of {', '.join(THEMES)}")
    name = resolve_theme(name)
    base = base_point_size(app)
    font = app.font()
    font.setPointSizeF(base * text_scale / 100)
    app.setFont(font)
    app.setStyle("Fusion")
    app.setPalette(build_palette(name))
    sheet = (RESOURCES / f"{name}.qss").read_text(encoding="utf-8")
    sheet = sheet.replace("{RESOURCES}", RESOURCES.as_posix())  # images live beside the sheets
    app.setStyleSheet(scaled_stylesheet(sheet, text_scale, base))
    return name
