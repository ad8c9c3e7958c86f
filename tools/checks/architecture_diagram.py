"""The picture in docs/architecture.md, drawn from the code: the floors (app, engine,
backends), their rooms, and an arrow wherever a module of one room imports one of another.

    .venv/bin/python -m tools.checks.architecture_diagram           # rewrite the diagram
    .venv/bin/python -m tools.checks.architecture_diagram --check   # exit 1 if it is stale

A room is a subpackage of a floor (`engine/models`, `backends/cuda`, with everything below
it), or a protocol module of the server (an `engine/server/*.py` that defines `router`: its
routes); a floor's other modules are its own room, named after it. Imports are read by
tools/checks/import_graph.py. The diagram is a Mermaid block between the markers below.
"""

import argparse
import ast
import sys
from pathlib import Path

from tools.checks.import_graph import PACKAGES, ROOT, Graph, import_graph, module_files

DOC = ROOT / "docs" / "architecture.md"
BEGIN = "<!-- architecture-diagram: begin (tools/checks/architecture_diagram.py writes this block) -->"
END = "<!-- architecture-diagram: end -->"
SERVER = "engine.server"


def protocol_modules(root: Path) -> set[str]:
    """The server's protocol modules: those of engine/server that define `router`."""
    found = set()
    for path in sorted((root / "engine" / "server").glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        if any(isinstance(node, ast.FunctionDef) and node.name == "router" for node in tree.body):
            found.add(f"{SERVER}.{path.stem}")
    return found


def room_of(module: str, subpackages: set[str], protocols: set[str]) -> str:
    """The room a module belongs to, as a path: its protocol module, its floor's
    subpackage, or the floor itself."""
    if module in protocols:
        return module.replace(".", "/")
    parts = module.split(".")
    if len(parts) > 1 and ".".join(parts[:2]) in subpackages:
        return "/".join(parts[:2])
    return parts[0]


def rooms_and_arrows(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> tuple[list[str], set[tuple[str, str]]]:
    """Every room (empty ones too), and the arrows between rooms that the imports draw."""
    graph: Graph = import_graph(root, packages)
    modules = module_files(root, packages)
    subpackages = {name for name, path in modules.items() if path.name == "__init__.py" and name.count(".") == 1}
    protocols = protocol_modules(root) if SERVER in subpackages else set()
    rooms = sorted({room_of(name, subpackages, protocols) for name in graph})
    arrows = {
        (room_of(source, subpackages, protocols), room_of(target, subpackages, protocols))
        for source, targets in graph.items()
        for target in targets
    }
    return rooms, {(a, b) for a, b in arrows if a != b}


def _node(room: str) -> str:
    return room.replace("/", "_")


def _label(room: str, floors: tuple[str, ...]) -> str:
    if room in floors:
        return f"{room}/ (its own modules)"
    if room.startswith("engine/server/"):
        return f"server protocol: {room.rsplit('/', 1)[1]}"
    return f"{room}/"


def mermaid(rooms: list[str], arrows: set[tuple[str, str]], floors: tuple[str, ...] = PACKAGES) -> str:
    """The diagram as a Mermaid flowchart: a box per floor holding its rooms, then the
    arrows (importer --> imported), sorted, so the same code gives the same text."""
    lines = ["```mermaid", "flowchart TB"]
    for floor in floors:
        lines.append(f'    subgraph floor_{floor}["{floor}"]')
        lines += [f'        {_node(room)}["{_label(room, floors)}"]' for room in rooms if room.split("/")[0] == floor]
        lines.append("    end")
    lines += [f"    {_node(a)} --> {_node(b)}" for a, b in sorted(arrows)]
    lines.append("```")
    return "\n".join(lines)


def render(root: Path = ROOT) -> str:
    """The diagram block as the document should hold it, markers included."""
    rooms, arrows = rooms_and_arrows(root)
    return f"{BEGIN}\n{mermaid(rooms, arrows)}\n{END}"


def committed(doc: str) -> str:
    """The diagram block `doc` holds now, markers included ("" where it has none)."""
    if BEGIN not in doc or END not in doc:
        return ""
    start = doc.index(BEGIN)
    return doc[start : doc.index(END, start) + len(END)]


def main() -> int:
    """Rewrite the diagram in docs/architecture.md, or with --check say whether it is current."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the committed diagram is stale")
    args = parser.parse_args()
    doc = DOC.read_text(encoding="utf-8")
    old, new = committed(doc), render()
    if not old:
        print(f"{DOC}: no diagram markers ({BEGIN!r} ... {END!r})", file=sys.stderr)
        return 1
    if args.check:
        print(f"{DOC.name}: the diagram is {'current' if old == new else 'stale: run this script without --check'}")
        return 0 if old == new else 1
    DOC.write_text(doc.replace(old, new), encoding="utf-8")
    print(f"{DOC.name}: diagram {'unchanged' if old == new else 'rewritten'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
