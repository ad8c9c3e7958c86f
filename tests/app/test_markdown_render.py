"""Markdown to Qt rich text: escaping, highlighting, Copy links, reasoning, streaming pieces."""

import random
import re

import pytest

from app.markdown_render import code_blocks, render_markdown, segments, split_reasoning

PYTHON_BLOCK = "```python\ndef greet(name):\n    return f'hi {name}'\n```\n"


def anchors(html: str) -> list[str]:
    """The href of every link in `html`, in order."""
    return re.findall(r'<a href="([^"]*)"', html)


@pytest.mark.parametrize("hostile", [
    "<script>alert(1)</script>",
    '<img src=x onerror="alert(1)">',
    '<a href="javascript:alert(1)">click</a>',
    "<div style='position:fixed'>overlay</div>",
])
def test_raw_html_is_shown_as_text_never_as_markup(hostile):
    html = render_markdown(f"Before {hostile} after\n\n{hostile}\n")
    tag = re.match(r"<(\w+)", hostile).group(1)
    assert f"<{tag}" not in html
    assert f"&lt;{tag}" in html


@pytest.mark.parametrize("link", [
    "[click](javascript:alert(1))",
    "<javascript:alert(1)>",
    "[f](file:///etc/passwd)",
    "[d](data:text/html;base64,PHNjcmlwdD4=)",
])
def test_dangerous_link_schemes_do_not_become_links(link):
    assert anchors(render_markdown(link)) == []


def test_images_become_plain_links_so_qt_never_loads_them():
    html = render_markdown("![a cat](https://example.com/cat.png)")
    assert "<img" not in html
    assert anchors(html) == ["https://example.com/cat.png"]
    assert "[image: a cat]" in html


def test_python_block_is_highlighted_with_inline_colours():
    html = render_markdown(PYTHON_BLOCK)
    keyword = re.search(r'<span style="([^"]*)">def</span>', html)
    assert keyword, "the keyword 'def' is not in a styled span"
    assert re.search(r"color:\s*#[0-9a-fA-F]{3,6}", keyword.group(1))
    assert "class=" not in html  # Qt ignores CSS classes: the colours must be inline


def test_dark_and_light_code_use_different_colours():
    light, dark = render_markdown(PYTHON_BLOCK), render_markdown(PYTHON_BLOCK, dark=True)
    colours = lambda html: set(re.findall(r"#[0-9a-fA-F]{6}\b", html))  # noqa: E731
    assert colours(light) != colours(dark)


def test_code_block_has_language_header_and_numbered_copy_links():
    text = f"One:\n\n{PYTHON_BLOCK}\n- a list\n\n  ```\n  nested\n  ```\n\n> ```rust\n> fn main() {{}}\n> ```\n"
    html = render_markdown(text)
    assert anchors(html) == ["copy-code:0", "copy-code:1", "copy-code:2"]
    assert ">python<" in html and ">rust<" in html
    assert code_blocks(text) == ["def greet(name):\n    return f'hi {name}'\n", "nested\n", "fn main() {}\n"]


def test_copy_links_can_start_after_earlier_blocks():
    assert anchors(render_markdown(PYTHON_BLOCK, first_code_index=4)) == ["copy-code:4"]


def test_code_inside_blocks_is_escaped_and_the_language_label_too():
    html = render_markdown("```<b>x\n<script>alert(1)</script>\n```\n")
    assert "<script" not in html and "<b>" not in html
    assert "&lt;script&gt;" in html


def test_unclosed_fence_while_streaming_renders_as_code_so_far():
    text = "Here:\n\n```python\nfor i in range(3):\n    print(i"
    html = render_markdown(text)
    assert anchors(html) == ["copy-code:0"]
    assert "<pre" in html and "print" in html
    assert code_blocks(text) == ["for i in range(3):\n    print(i"]


def test_common_markdown_reaches_qt_as_html():
    html = render_markdown(
        "# Title\n\nSome *emphasis*, **bold**, `code` and ~~gone~~.\n\n1. one\n2. two\n\n"
        "> quoted\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n[docs](https://example.com)\n"
    )
    for fragment in ("<h1", "<em>emphasis</em>", "<strong>bold</strong>", "<code", "<s>gone</s>",
                     "<ol", "<li>one</li>", "<blockquote", "<table", "<td>1</td>", 'href="https://example.com"'):
        assert fragment in html, fragment
    assert 'border="1"' in html  # Qt draws no table borders unless asked


@pytest.mark.parametrize("text, expected", [
    ("<think>Let me see.</think>\n\nThe answer is 4.", ("Let me see.", "The answer is 4.", True)),
    ("  \n<think>\nstill going", ("still going", "", False)),
    ("<think>", ("", "", False)),
    ("No reasoning here.", (None, "No reasoning here.", True)),
    ("<think>\n\n</think>\n\nDirect answer.", (None, "Direct answer.", True)),
    ("prompt-opened reasoning</think>answer", ("prompt-opened reasoning", "answer", True)),
    ("The tag <think> mid-text stays text.", (None, "The tag <think> mid-text stays text.", True)),
])
def test_split_reasoning(text, expected):
    assert split_reasoning(text) == expected


def _sample_document(seed: int) -> str:
    """A long markdown text made of the blocks models write, in a random order."""
    blocks = [
        "A paragraph with **bold** and `code` that goes on for a while. " * 5 + "\n",
        "```python\n" + "\n".join(f"x{i} = {i}\n" for i in range(15)) + "```\n",
        "1. one\n\n2. two\n\n   continued\n\n3. three\n",
        "> a quote\n> more\n",
        "# Heading\n",
        "Name | Value\n---|---\na | 1\n",
        "Title\n===\n",
        "    indented code\n",
    ]
    rng = random.Random(seed)
    return "\n".join(rng.choice(blocks) for _ in range(40))


@pytest.mark.parametrize("seed", range(4))
def test_pieces_render_like_the_whole_text(seed):
    text = _sample_document(seed)
    pieces = segments(text, size=300)
    assert len(pieces) > 3
    assert "".join(piece.source for piece in pieces) == text
    rendered = "".join(render_markdown(p.source, first_code_index=p.first_code_index) for p in pieces)
    assert rendered == render_markdown(text)


@pytest.mark.parametrize("seed", range(2))
def test_pieces_before_the_last_never_change_while_text_streams_in(seed):
    text = _sample_document(seed)
    previous = segments("", size=300)
    for end in range(1, len(text), 3):
        current = segments(text[:end], size=300)
        assert current[:len(previous) - 1] == previous[:-1], f"an earlier piece changed at {end}"
        previous = current
