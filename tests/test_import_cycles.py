"""No import cycles between the modules of app, engine and backends.

Every import counts, wherever it stands: at the top, inside a function, or under
`TYPE_CHECKING` (a type-only import is still one module knowing another). A cycle is
printed as the chain of modules that closes it, each arrow with the line of its import.
The walk is tools/checks/import_graph.py's.
"""

from tools.checks.import_graph import describe, find_cycles, import_graph


def test_no_import_cycles():
    graph = import_graph()
    cycles = find_cycles(graph)
    assert not cycles, "import cycles:\n" + "\n".join(describe(graph, cycle) for cycle in cycles)


def test_the_walk_sees_imports():
    """Guard against a walker that finds nothing: engine.models.common imports the blocks."""
    graph = import_graph()
    assert {"engine.models.attention", "engine.models.mlp", "engine.models.block"} <= set(graph["engine.models.common"])
    assert "engine.server.openai" in graph["engine.server.app"]


def test_a_cycle_is_found_and_printed(tmp_path):
    """Three modules in a ring (one import relative, one under TYPE_CHECKING, one inside a
    function), beside one that only imports them: one cycle, printed with its lines."""
    package = tmp_path / "ring"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from . import b\n")
    (package / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ring.c import C\n")
    (package / "c.py").write_text("def f():\n    import ring.a\n")
    (package / "user.py").write_text("import ring.a\nimport ring.b\n")
    graph = import_graph(tmp_path, ("ring",))
    cycles = find_cycles(graph)
    assert cycles == [["ring.a", "ring.b", "ring.c", "ring.a"]]
    assert describe(graph, cycles[0]) == "ring.a (line 1) -> ring.b (line 3) -> ring.c (line 2) -> ring.a"


def test_a_package_and_its_module_in_a_loop_are_a_cycle(tmp_path):
    """`from pkg import name` where name is not a module points at the package's __init__."""
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("from pkg.a import x\nVALUE = 1\n")
    (package / "a.py").write_text("from pkg import VALUE\nx = VALUE\n")
    assert find_cycles(import_graph(tmp_path, ("pkg",))) == [["pkg", "pkg.a", "pkg"]]


def test_a_tree_has_no_cycle(tmp_path):
    """A package that imports its module, which imports a sibling module through it: no cycle."""
    package = tmp_path / "tree"
    package.mkdir()
    (package / "__init__.py").write_text("from tree.a import x\n")
    (package / "a.py").write_text("from tree import b\nx = 1\n")
    (package / "b.py").write_text("")
    assert find_cycles(import_graph(tmp_path, ("tree",))) == []
