"""Markdown to the HTML subset that Qt's rich-text engine (QLabel, QTextDocument) draws.

Qt understands HTML 4 tags with inline `style` attributes, not stylesheets with classes,
so every colour and margin is written inline. Fenced code blocks are highlighted by
Pygments with inline styles and drawn as a two-row table: a header with the language and
a "Copy" link (`copy-code:N`, N counting the code blocks of one text from 0), then the
code. Raw HTML in the text is escaped, never passed through: a model's output must not
inject markup or links. A long text can be cut into `segments` that render on their own,
so that a streaming answer re-renders only its last piece. Nothing here imports Qt.
"""

import html
import re
from bisect import bisect_left
from dataclasses import asdict, dataclass
from functools import lru_cache
from itertools import accumulate, pairwise

from markdown_it import MarkdownIt
from markdown_it.token import Token
from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import get_lexer_by_name
from pygments.lexers.special import TextLexer
from pygments.util import ClassNotFound

COPY_CODE_SCHEME = "copy-code"
THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
CODE_TOKENS = ("fence", "code_block")
SEGMENT_CHARS = 1500  # characters per separately rendered piece of a long text
BREAK_EVERY = 20  # characters between the invisible break opportunities of a long unbroken run
ZERO_WIDTH_SPACE = "\u200b"


@dataclass(frozen=True)
class Theme:
    """The colours written into the HTML for one palette (light or dark)."""

    pygments_style: str
    code_background: str
    code_header: str
    border: str
    inline_code: str
    muted: str


LIGHT = Theme("default", "#f6f8fa", "#eaeef2", "#d0d7de", "#eff1f3", "#57606a")
DARK = Theme("one-dark", "#282c34", "#21252b", "#3d434d", "#3a3f4b", "#9aa4b2")


def theme(dark: bool) -> Theme:
    """The light or the dark colour set."""
    return DARK if dark else LIGHT


def split_reasoning(text: str) -> tuple[str | None, str, bool]:
    """Separate a leading `<think>…</think>` block from the answer.

    Returns (reasoning, answer, reasoning_complete). Without a think block the reasoning
    is None. An unclosed `<think>` (the model is still thinking) makes everything after
    it reasoning, with an empty answer and reasoning_complete False. A closing tag with
    no opening one counts too: some chat templates put `<think>` in the prompt, so the
    answer starts inside the block. An empty, closed block gives None.
    """
    stripped = text.lstrip()
    if stripped.startswith(THINK_OPEN):
        body = stripped[len(THINK_OPEN) :]
        end = body.find(THINK_CLOSE)
        if end < 0:
            return body.strip(), "", False
    else:
        end = text.find(THINK_CLOSE)
        if end < 0:
            return None, text, True
        body = text
    reasoning = body[:end].strip()
    answer = body[end + len(THINK_CLOSE) :].lstrip()
    return (reasoning or None), answer, True


def code_blocks(text: str) -> list[str]:
    """The source of each code block of `text`, in order: what `copy-code:N` copies.

    Fenced and indented blocks both count, in the order `render_markdown` numbers them.
    """
    return [token.content for token in _BLOCKS.parse(text) if token.type in CODE_TOKENS]


def render_markdown(text: str, dark: bool = False, first_code_index: int = 0) -> str:
    """Render markdown `text` as Qt rich-text HTML with the light or dark colours.

    Code blocks are numbered from `first_code_index` in their Copy links (a segment of a
    longer text starts after the blocks of the segments before it).
    """
    return breakable(_MD.render(text, {"theme": theme(dark), "code_index": first_code_index}))


LONG_RUN = re.compile(rf"[^\s<>&]{{{2 * BREAK_EVERY},}}")  # no '&': an entity's name is never split


def breakable(html: str) -> str:
    """`html` with a zero-width space every BREAK_EVERY characters of a long unbroken run of text.

    Qt's rich text wraps only at spaces, so a long word, URL or line of code would be cut
    off at the card's edge; the invisible breaks let it wrap. Tags and their attributes
    are left alone; Copy takes the message's source, which has no such breaks.
    """

    def split(run: re.Match) -> str:
        word = run.group(0)
        return ZERO_WIDTH_SPACE.join(word[i : i + BREAK_EVERY] for i in range(0, len(word), BREAK_EVERY))

    return re.sub(r">([^<]+)<", lambda text: ">" + LONG_RUN.sub(split, text.group(1)) + "<", html)


@dataclass(frozen=True)
class Segment:
    """A piece of a markdown text that renders on its own as it does in the whole."""

    source: str
    first_code_index: int  # how many code blocks come before it in the whole text


def segments(text: str, size: int = SEGMENT_CHARS) -> list[Segment]:
    """Cut `text` into pieces of at least `size` characters (the last may be shorter).

    Cuts fall only where a top-level block starts after a blank line, never inside a
    list, quote or code block, so each piece renders as it would in the whole text
    (reference-style link definitions aside). The cuts depend only on the text before
    them: as an answer streams, every piece but the last stays the same, and only the
    last needs rendering again.
    """
    if len(text) < size:
        return [Segment(text, 0)]
    text = text.replace("\r\n", "\n").replace("\r", "\n")  # markdown-it's line numbering
    lines = text.split("\n")
    offsets = list(accumulate((len(line) + 1 for line in lines), initial=0))
    tokens = _BLOCKS.parse(text)
    complete = len(lines) - 1  # the last line may still grow, and change what it starts
    cuts = [0]
    for token in tokens:
        start = token.map[0] if token.map and token.level == 0 and token.nesting >= 0 else 0
        long_enough = offsets[start] - offsets[cuts[-1]] >= size
        if cuts[-1] < start < complete and not lines[start - 1].strip() and long_enough:
            cuts.append(start)
    code_starts = [token.map[0] for token in tokens if token.type in CODE_TOKENS and token.map]
    bounds = [*cuts, len(lines)]
    return [
        Segment("\n".join(lines[first:end]) + ("\n" if end < len(lines) else ""), bisect_left(code_starts, first))
        for first, end in pairwise(bounds)
    ]


@lru_cache(maxsize=512)
def highlight_code(code: str, language: str, style: str) -> str:
    """Pygments HTML (inline-styled spans, no wrapper) of `code` in `language`, in `style`.

    Cached: while an answer streams, every finished block is re-rendered 30 times a
    second with the same source.
    """
    try:
        lexer = get_lexer_by_name(language) if language else TextLexer()
    except ClassNotFound:
        lexer = TextLexer()
    formatter = HtmlFormatter(noclasses=True, nowrap=True, style=style)
    return highlight(code, lexer, formatter)


def _code_block_html(code: str, language: str, index: int, colours: Theme) -> str:
    """A code block as a table: a header (language, Copy link), then the highlighted code.

    The header's two ends sit in a borderless inner table: Qt cannot drop the border
    between two cells of a bordered one.
    """
    body = highlight_code(code, language, colours.pygments_style).rstrip("\n")
    return (
        f'<table width="100%" cellspacing="0" cellpadding="0" border="1" '
        f'style="border-collapse:collapse; border-style:solid; border-color:{colours.border}; '
        f'background-color:{colours.code_background}; margin-top:4px; margin-bottom:10px;">'
        f'<tr><td style="background-color:{colours.code_header}; padding:4px 10px;">'
        f'<table width="100%" cellspacing="0" cellpadding="0" border="0" '
        f'style="color:{colours.muted}; font-size:small;">'
        f"<tr><td>{html.escape(language or 'code')}</td>"
        f'<td align="right"><a href="{COPY_CODE_SCHEME}:{index}" '
        f'style="color:{colours.muted}; text-decoration:none;">Copy</a></td></tr></table></td></tr>'
        f'<tr><td style="padding:8px 10px;">'
        f'<pre style="margin:0; white-space:pre-wrap;">{body}</pre></td></tr></table>\n'
    )


def _language(info: str) -> str:
    """The language named by a fence's info string (its first word)."""
    return info.split(maxsplit=1)[0] if info.strip() else ""


def _render_code(renderer, tokens: list[Token], idx: int, options, env: dict) -> str:
    """Render rule for fenced and indented code blocks; numbers them through `env`."""
    token = tokens[idx]
    index = env["code_index"]
    env["code_index"] = index + 1
    return _code_block_html(token.content, _language(token.info), index, env["theme"])


def _render_code_inline(renderer, tokens: list[Token], idx: int, options, env: dict) -> str:
    """Inline code: monospace on a subtle background."""
    colours = env["theme"]
    code = html.escape(tokens[idx].content)
    return f'<code style="background-color:{colours.inline_code};">&nbsp;{code}&nbsp;</code>'


def _render_image(renderer, tokens: list[Token], idx: int, options, env: dict) -> str:
    """Images become links to them: Qt would otherwise load local files named by a model."""
    token = tokens[idx]
    alt = html.escape(renderer.renderInlineAsText(token.children or [], options, env) or "image")
    src = html.escape(str(token.attrGet("src") or ""))
    return f'<a href="{src}">[image: {alt}]</a>'


# Qt's default margins suit a web page, not a chat message; blocks get these instead.
_BLOCK_MARGINS = "margin-top:0; margin-bottom:8px;"
BLOCK_STYLES = {
    "p": _BLOCK_MARGINS,
    "ul": _BLOCK_MARGINS,
    "ol": _BLOCK_MARGINS,
    "h1": "font-size:x-large; margin-top:10px; margin-bottom:6px;",
    "h2": "font-size:large; margin-top:10px; margin-bottom:6px;",
    "blockquote": "color:{muted}; margin-left:16px; " + _BLOCK_MARGINS,
    "table": "border-collapse:collapse; border-style:solid; border-color:{border}; margin-top:4px; margin-bottom:10px;",
}
HEADING_STYLE = "font-size:medium; margin-top:8px; margin-bottom:4px;"  # h3 to h6
TABLE_ATTRIBUTES = {"border": "1", "cellspacing": "0", "cellpadding": "6"}  # thin cell borders


def _render_styled_open(renderer, tokens: list[Token], idx: int, options, env: dict) -> str:
    """Render rule for opening block tags: adds the inline style of BLOCK_STYLES."""
    token = tokens[idx]
    style = BLOCK_STYLES.get(token.tag, HEADING_STYLE)
    token.attrSet("style", style.format(**asdict(env["theme"])))
    if token.tag == "table":
        for name, value in TABLE_ATTRIBUTES.items():
            token.attrSet(name, value)
    return renderer.renderToken(tokens, idx, options, env)


def _build_parser() -> MarkdownIt:
    """CommonMark with tables and strikethrough, raw HTML off, single newlines kept."""
    md = MarkdownIt("commonmark", {"html": False, "breaks": True}).enable(["table", "strikethrough"])
    rules = {
        "fence": _render_code,
        "code_block": _render_code,
        "code_inline": _render_code_inline,
        "image": _render_image,
    }
    styled = (
        "paragraph_open",
        "heading_open",
        "bullet_list_open",
        "ordered_list_open",
        "blockquote_open",
        "table_open",
    )
    rules.update(dict.fromkeys(styled, _render_styled_open))
    for name, rule in rules.items():
        md.add_render_rule(name, rule)
    return md


_MD = _build_parser()
_BLOCKS = _build_parser().disable(["inline", "text_join"])  # block structure only: much faster
