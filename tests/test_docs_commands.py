"""The docs' commands still run, and name only scripts, modules, flags and make targets that exist.

A shell block in README.md or docs/*.md is marked runnable by an HTML comment on the line
right before its fence (GitHub shows the comment as nothing):

    <!-- runnable -->
    ```sh
    python -m engine info smollm2
    ```

Each marked block runs in bash (`-e -o pipefail`) from the repository root, with this test's
Python environment's bin folder first on PATH (so `python` and `sprig` are the venv's),
offline (`HF_HUB_OFFLINE=1`) and with Qt offscreen, and must exit 0 within its timeout. Mark
only what is cheap (a few seconds): the tests below run every marked block on every test run.

Unmarked blocks (benchmarks, the window, downloads, installers) are not run, but every command
in any shell block or inline code span is checked against the code: a `python tools/...`
script or `python -m ...` module of this repository must exist, each `--flag` given to it must
be one its `--help` lists (for `python -m engine`, its subcommand's own flags), and a
`make TARGET` must be a target of the Makefile.
"""

import argparse
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
MARKER = "<!-- runnable -->"
SHELL_INFOS = {"sh", "bash", "shell", "console"}
BLOCK_TIMEOUT_S = 120
FENCE = re.compile(r"^\s*(```+|~~~+)\s*([\w+-]*)")
INLINE_CODE = re.compile(r"(?<!`)`([^`]+)`(?!`)")
MAKE_TARGET = re.compile(r"(?:^|[\s;&|(])make\s+([a-z][\w-]*)")
TOOL_PATH = re.compile(r"\btools/[\w./*-]+\.(?:py|sh)\b")
PYTHON = re.compile(r"(?:^|/)python3?$")
# Run by another interpreter than the app's venv (a Python with llama-cpp-python): existence only.
PEER_SCRIPTS = {"tools/bench/bench_llama_cpp.py"}


@dataclass(frozen=True)
class Block:
    """One fenced code block of a doc: where it starts, its info string, its text, and its mark."""

    doc: Path
    line: int
    info: str
    text: str
    runnable: bool

    @property
    def name(self) -> str:
        """`README.md:42`, for test ids and messages."""
        return f"{self.doc.relative_to(ROOT)}:{self.line}"


def fenced_blocks(doc: Path) -> list[Block]:
    """Every fenced block of a Markdown file, in order."""
    lines = doc.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        fence, info = opening.groups()
        end = i + 1
        while end < len(lines) and not lines[end].strip().startswith(fence):
            end += 1
        runnable = i > 0 and lines[i - 1].strip() == MARKER
        blocks.append(Block(doc, i + 1, info.lower(), "\n".join(lines[i + 1 : end]), runnable))
        i = end + 1
    return blocks


def prose(doc: Path) -> str:
    """A Markdown file's text outside its fenced blocks."""
    kept, inside = [], None
    for line in doc.read_text(encoding="utf-8").splitlines():
        opening = FENCE.match(line)
        if inside is None and opening:
            inside = opening.group(1)
        elif inside is not None and line.strip().startswith(inside):
            inside = None
        elif inside is None:
            kept.append(line)
    return "\n".join(kept)


def command_lines(doc: Path) -> list[str]:
    """The shell commands a doc shows: its shell blocks' lines (continuations joined) and its inline code."""
    commands: list[str] = []
    for block in fenced_blocks(doc):
        if block.info in SHELL_INFOS or block.info == "":
            commands += block.text.replace("\\\n", " ").splitlines()
    commands += [span.replace("\n", " ") for span in INLINE_CODE.findall(prose(doc))]
    return commands


def invocations(command: str) -> list[list[str]]:
    """The simple commands of a shell line, as words: split at `;`, `&&`, `||`, `|`, without comments."""
    text = command.split(" #")[0].strip()
    found = []
    for part in re.split(r"&&|\|\||;|\|", text):
        try:
            words = shlex.split(part)
        except ValueError:  # an unbalanced quote or `$(` spanning parts: not a command to check
            continue
        if words:
            found.append(words)
    return found


def runnable_blocks() -> list[Block]:
    """Every block marked runnable in README.md and docs/*.md."""
    return [block for doc in DOCS for block in fenced_blocks(doc) if block.runnable]


def run_env() -> dict[str, str]:
    """The environment a marked block runs in: the venv first on PATH, offline, Qt offscreen."""
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["HF_HUB_OFFLINE"] = "1"
    env["QT_QPA_PLATFORM"] = "offscreen"
    return env


@cache
def help_text(*command: str) -> str:
    """What `command --help` prints, run from the repository root in the venv."""
    result = subprocess.run(
        [*command, "--help"], cwd=ROOT, env=run_env(), capture_output=True, text=True, timeout=BLOCK_TIMEOUT_S
    )
    assert result.returncode == 0, f"{' '.join(command)} --help failed:\n{result.stderr[-2000:]}"
    return result.stdout


@cache
def engine_flags() -> dict[str, set[str]]:
    """Each `python -m engine` subcommand's option strings (and, under "", the top level's)."""
    from engine.cli import build_parser

    parser = build_parser()
    flags = {"": set(parser._option_string_actions)}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            flags |= {name: set(sub._option_string_actions) for name, sub in action.choices.items()}
    return flags


def module_path(module: str) -> Path | None:
    """The file or folder of a module of this repository, or None when it is not ours (pip, venv)."""
    parts = module.split(".")
    if not (ROOT / parts[0]).is_dir():
        return None
    base = ROOT.joinpath(*parts)
    for candidate in (base.with_suffix(".py"), base / "__main__.py", base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return base


def flags_of(words: list[str]) -> list[str]:
    """The long options among a command's words, without their `=value` (`[--port 8080]` counts too)."""
    options = [word.lstrip("[").split("=")[0].rstrip("]") for word in words]
    return [option for option in options if option.startswith("--") and len(option) > 2]


def lists(help_output: str, flag: str) -> bool:
    """Whether a `--help` output names this option whole (`--dep` is not `--depths`)."""
    return re.search(rf"{re.escape(flag)}(?![\w-])", help_output) is not None


def check_python(words: list[str], where: str) -> list[str]:
    """Problems with one `python -m MODULE ...` or `python SCRIPT ...` command: a missing target or flag."""
    if len(words) < 2:
        return []
    if words[1] == "-m" and len(words) > 2:
        module, args = words[2], words[3:]
        path = module_path(module)
        if path is None:
            return []
        if not path.exists():
            return [f"{where}: `python -m {module}`: no {path.relative_to(ROOT)}"]
        if module == "engine":
            return check_engine(args, where)
        given = ("python", "-m", module)
    elif words[1].endswith(".py"):
        script, args = words[1], words[2:]
        if not (ROOT / script).is_file():
            return [f"{where}: `python {script}`: no such file"]
        if script in PEER_SCRIPTS:
            return []
        given = ("python", script)
    else:
        return []
    flags = flags_of(args)  # a script without flags is not asked for its help: some run at once
    listed = help_text(*given) if flags else ""
    return [f"{where}: {' '.join(given[1:])} has no {flag}" for flag in flags if not lists(listed, flag)]


def check_engine(args: list[str], where: str) -> list[str]:
    """Problems with `python -m engine [SUBCOMMAND] ...`: an unknown subcommand or a flag it does not take."""
    flags = engine_flags()
    command = args[0] if args and not args[0].startswith("-") else ""
    if command.isupper():  # a placeholder: `python -m engine COMMAND --help`
        return []
    if command not in flags:
        return [f"{where}: `python -m engine {command}`: no such subcommand"]
    return [f"{where}: `engine {command}` has no {flag}" for flag in flags_of(args) if flag not in flags[command]]


def check_sprig(words: list[str], where: str) -> list[str]:
    """Problems with a `sprig ...` command: `sprig pull` is the engine's pull; the rest, `sprig --help`."""
    if words[1:2] == ["pull"]:
        return check_engine(words[1:], where)
    flags = flags_of(words[1:])
    listed = help_text("sprig") if flags else ""
    return [f"{where}: sprig has no {flag}" for flag in flags if not lists(listed, flag)]


@pytest.mark.parametrize("block", runnable_blocks(), ids=lambda block: block.name)
def test_a_runnable_block_exits_0(block: Block):
    assert block.info in SHELL_INFOS, f"{block.name}: {MARKER} marks a {block.info or 'plain'} block, not a shell one"
    result = subprocess.run(
        ["bash", "-e", "-o", "pipefail", "-c", block.text],
        cwd=ROOT,
        env=run_env(),
        capture_output=True,
        text=True,
        timeout=BLOCK_TIMEOUT_S,
    )
    assert result.returncode == 0, (
        f"{block.name} exited {result.returncode}:\n{block.text}\n--- stdout\n{result.stdout[-3000:]}"
        f"\n--- stderr\n{result.stderr[-3000:]}"
    )


def test_the_readme_and_the_docs_mark_blocks_runnable():
    marked = {block.doc.name for block in runnable_blocks()}
    assert {"README.md", "engine-cli.md"} <= marked, marked


def test_every_script_named_in_the_docs_exists():
    missing = []
    for doc in DOCS:
        for name in sorted(set(TOOL_PATH.findall(doc.read_text(encoding="utf-8")))):
            found = list(ROOT.glob(name)) if "*" in name else [ROOT / name] if (ROOT / name).exists() else []
            if not found:
                missing.append(f"{doc.relative_to(ROOT)}: {name}")
    assert not missing, "\n".join(missing)


def test_every_command_in_the_docs_names_what_the_code_has():
    problems = []
    for doc in DOCS:
        where = str(doc.relative_to(ROOT))
        for command in command_lines(doc):
            for words in invocations(command):
                if PYTHON.search(words[0]):
                    problems += check_python(words, where)
                elif words[0].endswith("sprig") and len(words) > 1:
                    problems += check_sprig(words, where)
    assert not problems, "\n".join(sorted(set(problems)))


def test_every_make_target_in_the_docs_is_in_the_makefile():
    targets = set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), flags=re.MULTILINE))
    named = {
        (doc.relative_to(ROOT), target)
        for doc in DOCS
        for command in command_lines(doc)
        for target in MAKE_TARGET.findall(command)
    }
    unknown = sorted(f"{doc}: make {target}" for doc, target in named if target not in targets)
    assert not unknown, "\n".join(unknown)


LINK = re.compile(r"\]\(([^)\s]+)\)")


def anchors(doc: Path) -> set[str]:
    """The anchors GitHub gives a Markdown file's headings: lower case, punctuation dropped, spaces as hyphens."""
    headings = re.findall(r"^#+\s+(.+?)\s*$", prose(doc), flags=re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-") for heading in headings}


def test_every_relative_link_in_the_docs_resolves():
    broken = []
    for doc in DOCS:
        for target in LINK.findall(prose(doc)):
            if re.match(r"[a-z]+:", target):  # https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            linked = (doc.parent / path).resolve() if path else doc
            if not linked.exists():
                broken.append(f"{doc.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
                broken.append(f"{doc.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, "\n".join(broken)
