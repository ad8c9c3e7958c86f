"""Which module of app, engine and backends imports which, read from the source (no import runs).

Every import counts, wherever it stands: at the top, inside a function, or under
`TYPE_CHECKING` (a type-only import is still one module knowing another). Used by
tests/test_import_cycles.py (no cycles) and tools/checks/architecture_diagram.py (the picture).

    .venv/bin/python -m tools.checks.import_graph     # prints the cycles, exit 1 if any
"""

import ast
import itertools
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("app", "engine", "backends")

Graph = dict[str, dict[str, int]]  # module -> {module it imports: line of the first such import}


def module_files(root: Path, packages: tuple[str, ...]) -> dict[str, Path]:
    """Every module of `packages` under `root` by dotted name (a package by its own name)."""
    found: dict[str, Path] = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imported_modules(name: str, path: Path, modules: dict[str, Path]) -> dict[str, int]:
    """The modules of `modules` that module `name` (at `path`) imports, each with the line
    of its first import. `from a import b` names the module a.b where there is one, else a."""
    found: dict[str, int] = {}
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from the package, `level - 1` packages up
                base = ".".join([*package[: len(package) - node.level + 1], *([node.module] if node.module else [])])
            else:
                base = node.module or ""
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
        else:
            continue
        for target in targets:
            if target in modules and target != name:
                found[target] = min(found.get(target, node.lineno), node.lineno)
    return found


def import_graph(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> Graph:
    """Each module's imports of the others (`imported_modules`)."""
    modules = module_files(root, packages)
    return {name: imported_modules(name, path, modules) for name, path in modules.items()}


def find_cycles(graph: Graph) -> list[list[str]]:
    """One cycle (its modules in import order, the first repeated at the end) for each group
    of modules that import each other through any chain (a strongly connected component)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []

    def enter(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)

    for start in sorted(graph):  # Tarjan's algorithm, iterative: import chains may be long
        if start in index:
            continue
        enter(start)
        work = [(start, iter(sorted(graph[start])))]
        while work:
            node, edges = work[-1]
            for target in edges:
                if target not in index:
                    enter(target)
                    work.append((target, iter(sorted(graph[target]))))
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    group: set[str] = set()
                    while node not in group:
                        member = stack.pop()
                        on_stack.discard(member)
                        group.add(member)
                    if len(group) > 1:
                        groups.append(group)
    return [_cycle_within(graph, group) for group in groups]


def _cycle_within(graph: Graph, group: set[str]) -> list[str]:
    """A shortest chain of imports from the group's first module back to itself, inside the group."""
    first = min(group)
    came_from: dict[str, str] = {}
    frontier = [first]
    while frontier:
        following = []
        for node in frontier:
            for target in sorted(graph[node]):
                if target == first:
                    path = [node]
                    while path[-1] != first:
                        path.append(came_from[path[-1]])
                    return [*reversed(path), first]
                if target in group and target not in came_from:
                    came_from[target] = node
                    following.append(target)
        frontier = following
    raise AssertionError(f"no cycle through {first}")  # a strongly connected group always has one


def describe(graph: Graph, cycle: list[str]) -> str:
    """A cycle as `a (line 3) -> b (line 9) -> a`: each module with the line of its import of the next."""
    steps = [f"{a} (line {graph[a][b]})" for a, b in itertools.pairwise(cycle)]
    return " -> ".join([*steps, cycle[-1]])


def main() -> int:
    """Print every import cycle of app, engine and backends; 1 if there is any."""
    graph = import_graph()
    cycles = find_cycles(graph)
    for cycle in cycles:
        print(describe(graph, cycle))
    if not cycles:
        print(f"no import cycles among {len(graph)} modules")
    return 1 if cycles else 0


if __name__ == "__main__":
    sys.exit(main())
