"""The import graph of zerorun/, launcher/ and bench/, read from the source, has no cycle.

Every import is an arrow, lazy and ``TYPE_CHECKING`` ones included (the imports are read by
:func:`tests.test_layering.imports_of`). An arrow goes to the module whose code the name needs:
``from a.b import f`` and ``import a.b`` point at ``a.b``; ``from a import b`` points at the
submodule ``a.b`` when there is one (the package's ``__init__`` only passes it on), else at
``a``'s ``__init__`` (a name it defines or re-exports). A package's ``__init__`` is not an arrow
from each module under it.

The launcher is a few rooms (plan, run, watch, doctor, elastic): each a folder with a one-line
docstring in ``__init__.py`` saying what it owns, ``launcher/`` itself holding at most 12 files
(none over 400 lines), and the rooms import one another only downwards (``ROOMS_BELOW``; docs/design.md draws it).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.test_layering import FILE_LINES, imports_of

ROOT = Path(__file__).resolve().parent.parent
TOPS = ("zerorun", "launcher", "bench")
LAUNCHER_FILES = 12
# what each launcher room may import, besides the shared modules at launcher/'s top (errors, protocol, ...),
# which import no room; only main.py and args.py, above the rooms, import any of them
ABOVE_ROOMS = ("launcher.main", "launcher.args")
ROOMS_BELOW = {
    "plan": set(),
    "watch": {"plan"},
    "run": {"plan", "watch"},
    "doctor": {"plan"},
    "elastic": {"plan", "watch", "run", "doctor"},
}


def module_files(root: Path = ROOT, tops: tuple[str, ...] = TOPS) -> dict[str, Path]:
    """Dotted module name -> file, for every Python file under ``tops`` (a package is its ``__init__``)."""
    out = {}
    for top in tops:
        for path in sorted((root / top).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _module_of(name: str, modules: dict[str, Path]) -> str | None:
    """The longest prefix of ``name`` that is a module (``a.b.f`` -> ``a.b``); None outside the tree."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the modules it imports, within ``modules``."""
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        names = imports_of(path)
        targets = set()
        for name in names:
            target = _module_of(name, modules)
            # a module named only as the package of a submodule it imports (`from a import b`) is no arrow
            if target and (name != target or not any(other.startswith(name + ".") for other in names)):
                targets.add(target)
        graph[module] = targets - {module}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle (``[a, b, ..., a]``) through each strongly connected group of modules (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = set()
            while True:
                group.add(member := stack.pop())
                if member == node:
                    break
            if len(group) > 1:
                groups.append(group)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return [_a_cycle_in(group, graph) for group in groups]


def _a_cycle_in(group: set[str], graph: dict[str, set[str]]) -> list[str]:
    """The shortest way from the group's first module back to itself, inside the group (breadth first)."""
    start = min(group)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for nxt in sorted(graph[node] & group):
                if nxt == start:
                    return [*paths[node], start]
                if nxt not in paths:
                    paths[nxt] = [*paths[node], nxt]
                    following.append(nxt)
        frontier = following
    raise AssertionError(f"no way back to {start} in a strongly connected group {sorted(group)}")


def test_the_import_graph_has_no_cycle() -> None:
    found = cycles(import_graph(module_files()))
    assert not found, "import cycles (break each with a narrow Protocol, or move the shared part down):\n" + \
        "\n".join(" -> ".join(c) for c in found)


def test_the_graph_reads_every_import_and_resolves_it(tmp_path: Path) -> None:
    pkg = tmp_path / "p"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from p.a import f\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from p.b import B\ndef f(): ...\n")
    (pkg / "b.py").write_text("def g():\n    from p import sub\n    import p.c\nclass B: ...\n")
    (pkg / "c.py").write_text("from p import f\n")
    (pkg / "sub" / "d.py").write_text("import json\n")
    graph = import_graph(module_files(tmp_path, ("p",)))
    assert graph == {"p": {"p.a"}, "p.a": {"p.b"}, "p.b": {"p.sub", "p.c"}, "p.c": {"p"}, "p.sub": set(),
                     "p.sub.d": set()}
    assert cycles(graph) == [["p", "p.a", "p.b", "p.c", "p"]]
    assert cycles({"x": {"y"}, "y": {"x"}, "z": {"x"}}) == [["x", "y", "x"]]
    assert cycles({"x": {"y"}, "y": set()}) == []


def test_the_launcher_holds_a_few_files_and_rooms() -> None:
    launcher = ROOT / "launcher"
    files = sorted(p.name for p in launcher.glob("*.py"))
    assert len(files) <= LAUNCHER_FILES, f"launcher/ holds {len(files)} files (at most {LAUNCHER_FILES}): {files}"
    rooms = sorted(p.parent.name for p in launcher.glob("*/*.py"))
    assert set(rooms) == set(ROOMS_BELOW), f"launcher's rooms {sorted(set(rooms))} != {sorted(ROOMS_BELOW)}"


def test_no_launcher_or_bench_file_is_over_400_lines() -> None:
    """test_layering holds zerorun/'s files to the limit; the launcher's and bench's are held here."""
    files = [*(ROOT / "launcher").rglob("*.py"), *(ROOT / "bench").rglob("*.py")]
    long = {str(p.relative_to(ROOT)): n for p in files if (n := len(p.read_text().splitlines())) > FILE_LINES}
    assert not long, f"files over {FILE_LINES} lines: {long}"


@pytest.mark.parametrize("room", sorted(ROOMS_BELOW))
def test_each_launcher_room_says_what_it_owns_in_one_line(room: str) -> None:
    init = ROOT / "launcher" / room / "__init__.py"
    assert init.is_file(), f"launcher/{room}/ has no __init__.py"
    doc = ast.get_docstring(ast.parse(init.read_text()))
    assert doc and "\n" not in doc.strip(), f"launcher/{room}/__init__.py: a one-line docstring, not {doc!r}"


def room_arrows(graph: dict[str, set[str]]) -> dict[tuple[str, str], list[str]]:
    """(room, room it imports) -> the module arrows behind it, between the launcher's rooms."""
    def room(module: str) -> str | None:
        parts = module.split(".")
        return parts[1] if parts[0] == "launcher" and len(parts) > 2 else None

    out: dict[tuple[str, str], list[str]] = {}
    for module, targets in graph.items():
        for target in targets:
            here, there = room(module), room(target)
            if here is not None and there is not None and here != there:
                out.setdefault((here, there), []).append(f"{module} -> {target}")
    return out


def test_the_launcher_rooms_import_downwards_only() -> None:
    graph = import_graph(module_files(ROOT, ("launcher",)))
    wrong = {f"{a} -> {b}": sorted(why) for (a, b), why in room_arrows(graph).items() if b not in ROOMS_BELOW[a]}
    assert not wrong, f"launcher rooms importing upwards or sideways (see ROOMS_BELOW): {wrong}"
    shared = [m for m in graph if m.count(".") == 1 and m not in ABOVE_ROOMS]
    upward = sorted(f"{m} -> {t}" for m in shared for t in graph[m] if t.count(".") > 1)
    assert len(shared) >= 3 and not upward, f"launcher's shared modules import a room: {upward}"
