"""The package's layers, read from the source: the engine never imports what is built on it.

Every import counts, also those inside functions (a lazy import is still an arrow). The
engine sits under the toolkit (autotune, the CLI and its commands, simulate), under the
DeepSpeed compatibility layer and under the public facade ``zerorun.zero``; the trial
contract (:mod:`zerorun.trial`) sits under both the engine and the tuner, and the simulated
world (:mod:`zerorun.simulate`'s fake group, ``fake_world``) under the engine's bootstrap, while
the package's drivers (run, model, compare, peak, report) sit above the engine.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "zerorun"
ABOVE_ENGINE = ("zerorun.autotune", "zerorun.cli", "zerorun.commands", "zerorun.compat", "zerorun.zero",
                "zerorun.simulate.model", "zerorun.simulate.run", "zerorun.simulate.compare", "zerorun.simulate.peak",
                "zerorun.simulate.report")


def imports_of(path: Path) -> set[str]:
    """Every module ``path`` imports (absolute names; ``from a import b`` counts ``a`` and ``a.b``)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
            out.update(f"{node.module}.{alias.name}" for alias in node.names)
    return out


def _under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def _sources(sub: str) -> list[Path]:
    path = PACKAGE / sub
    return [path] if path.is_file() else sorted(path.rglob("*.py"))


@pytest.mark.parametrize("path", _sources("engine"), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_the_engine_imports_nothing_built_on_it(path: Path) -> None:
    wrong = sorted(n for n in imports_of(path) if any(_under(n, p) for p in ABOVE_ENGINE))
    assert not wrong, f"{path.relative_to(PACKAGE.parent)} imports {wrong}"


@pytest.mark.parametrize("sub", ["trial", "config", "estimate", "simulate/__init__.py", "simulate/fake_world.py",
                                 "errors.py", "heartbeat"])
def test_the_lower_layers_import_no_engine(sub: str) -> None:
    for path in _sources(sub):
        wrong = sorted(n for n in imports_of(path) if _under(n, "zerorun.engine") or _under(n, "zerorun.autotune"))
        assert not wrong, f"{path.relative_to(PACKAGE.parent)} imports {wrong}"


def test_the_tuner_reaches_the_engine_only_through_processes() -> None:
    """autotune starts trials as processes; it shares the trial contract, not the engine's modules."""
    for path in _sources("autotune"):
        wrong = sorted(n for n in imports_of(path) if _under(n, "zerorun.engine"))
        assert not wrong, f"{path.relative_to(PACKAGE.parent)} imports {wrong}"


def test_the_walk_sees_lazy_imports(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text("def f():\n    from zerorun.compat import surface\n    import zerorun.cli\n")
    assert {"zerorun.compat", "zerorun.compat.surface", "zerorun.cli"} <= imports_of(source)


def _names_a_stage(node: ast.expr) -> bool:
    name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""
    return name in ("stage", "zero_stage", "zero_optimization_stage")


def stage_comparisons(path: Path) -> list[int]:
    """Lines of ``path`` that compare a stage number (``stage == 3``, ``engine.zero_stage < 2``, ``stage in (1, 2)``)."""
    return sorted(node.lineno for node in ast.walk(ast.parse(path.read_text()))
                  if isinstance(node, ast.Compare) and any(map(_names_a_stage, [node.left, *node.comparators])))


def test_a_stage_number_is_compared_only_in_the_policy() -> None:
    """The engine asks the policy's questions (shard_optimizer, shard_gradients, shard_parameters)."""
    found = {str(p.relative_to(PACKAGE)): lines for p in _sources("engine")
             if p.name != "policy.py" and (lines := stage_comparisons(p))}
    assert not found, f"stage numbers compared outside engine/policy.py: {found}"


def test_the_stage_check_sees_comparisons(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text("if engine.zero_stage == 3:\n    pass\nx = 2 <= stage\ny = cfg.stage in (1, 2)\nz = stage\n")
    assert stage_comparisons(source) == [1, 3, 4]


# ---- the shape of the source: typed annotations, short files and functions ---------------------------------
BARE_ANY_LIMIT = 40  # issue 22: what is left is forwarded *args/**kwargs, module outputs and delegation
FILE_LINES = 400
FUNCTION_LINES = 60


def bare_anys(path: Path) -> list[int]:
    """Lines of ``path`` with an annotation that is exactly ``Any``: arguments (``*args``/``**kwargs``
    too), returns, annotated assignments."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text())):
        annotations: list[ast.expr | None] = []
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = node.args
            annotations = [x.annotation for x in [*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg] if x]
            annotations.append(node.returns)
        elif isinstance(node, ast.AnnAssign):
            annotations = [node.annotation]
        lines += [an.lineno for an in annotations if an is not None and ast.unparse(an) in ("Any", "typing.Any")]
    return lines


def test_the_engine_annotations_name_their_types() -> None:
    found = {str(p.relative_to(PACKAGE)): lines for p in _sources("engine") if (lines := bare_anys(p))}
    count = sum(map(len, found.values()))
    assert count < BARE_ANY_LIMIT, f"{count} bare `Any` annotations in zerorun/engine (limit {BARE_ANY_LIMIT}): {found}"


def test_the_any_count_sees_every_annotation(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text("from typing import Any\n"
                      "def f(a: Any, *args: Any, b: int, **kw: Any) -> Any:\n    x: Any = a\n    y: list[Any] = []\n"
                      "class C:\n    z: Any\n")
    assert bare_anys(source) == [2, 2, 2, 2, 3, 6]


def long_functions(path: Path, limit: int = FUNCTION_LINES) -> dict[str, int]:
    """Functions (and methods) of ``path`` longer than ``limit`` lines, decorators and docstring included."""
    return {node.name: node.end_lineno - min([node.lineno, *(d.lineno for d in node.decorator_list)]) + 1
            for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno is not None
            and node.end_lineno - min([node.lineno, *(d.lineno for d in node.decorator_list)]) + 1 > limit}


def test_no_file_is_over_400_lines() -> None:
    """STYLE.md: past ~400 lines a file holds more than one concept; split it by concept."""
    found = {str(p.relative_to(PACKAGE)): n for p in _sources("") if (n := len(p.read_text().splitlines())) > FILE_LINES}
    assert not found, f"files over {FILE_LINES} lines: {found}"


def test_no_engine_function_is_over_60_lines() -> None:
    found = {f"{p.relative_to(PACKAGE)}:{name}": n for p in _sources("engine") for name, n in long_functions(p).items()}
    assert not found, f"functions over {FUNCTION_LINES} lines in zerorun/engine: {found}"


def test_the_length_check_counts_a_whole_function(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text("@staticmethod\ndef f():\n" + "    x = 1\n" * 3 + "\ndef g():\n    pass\n")
    assert long_functions(source, limit=4) == {"f": 5}
    assert long_functions(source, limit=5) == {}


def type_ignores(path: Path) -> list[int]:
    """Lines of ``path`` whose comment silences the type checker (``# type: ignore``, with or without codes)."""
    import io
    import tokenize

    tokens = tokenize.generate_tokens(io.StringIO(path.read_text()).readline)
    return [t.start[0] for t in tokens if t.type == tokenize.COMMENT and re.search(r"#\s*type:\s*ignore", t.string)]


def test_the_engine_communication_needs_no_type_ignore() -> None:
    found = {str(p.relative_to(PACKAGE)): lines for p in _sources("engine/comm") if (lines := type_ignores(p))}
    assert not found, f"`type: ignore` in zerorun/engine/comm: {found}"


def test_the_ignore_check_reads_comments_only(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text('x = f()  # type: ignore[attr-defined]\ns = "# type: ignore"\ny = 1  #type:ignore\n')
    assert type_ignores(source) == [1, 3]
