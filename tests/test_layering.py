"""The package's layers, read from the source: the engine never imports what is built on it.

Every import counts, also those inside functions (a lazy import is still an arrow). The
engine sits under the toolkit (autotune, the CLI and its commands, simulate), under the
DeepSpeed compatibility layer and under the public facade ``zerorun.zero``; the trial
contract (:mod:`zerorun.trial`) sits under both the engine and the tuner, and the simulated
world (:mod:`zerorun.simulate`, torch's fake group) under the engine's bootstrap.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "zerorun"
ABOVE_ENGINE = ("zerorun.autotune", "zerorun.cli", "zerorun.commands", "zerorun.compat", "zerorun.zero",
                "zerorun.simulate_model", "zerorun.simulate_run", "zerorun.simulate_compare", "zerorun.simulate_peak",
                "zerorun.simulate_report")


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


@pytest.mark.parametrize("sub", ["trial", "config", "estimate", "simulate.py", "errors.py"])
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
