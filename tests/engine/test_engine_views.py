"""engine/views.py: the narrow Protocols checkpoint/, surface/ and trial.py read the engine through.

Two sides, both checked without a type checker: the Engine has every member each view names
(a real engine, built as rank 0 of a simulated world of one), and each function that takes a
view reads only what that view names (from the source: ``engine.x`` where ``engine: View``,
``self.x`` where ``self: View``, and ``self.<field>.x`` where ``__init__`` stored a view in
``self.<field>``). A new read outside the view fails here: widen the view, with a reason.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch
from torch import nn

import zerorun
from zerorun.engine import views

ENGINE = Path(views.__file__).resolve().parent
VIEWS = {name: cls for name, cls in vars(views).items()
         if isinstance(cls, type) and getattr(cls, "_is_protocol", False) and cls.__module__ == views.__name__}


def members(view: type) -> set[str]:
    """The names a Protocol declares: its annotations, methods and properties, with its bases'."""
    out: set[str] = set()
    for cls in view.__mro__:
        if cls.__module__ == views.__name__:
            out |= set(cls.__dict__.get("__annotations__", {}))
            out |= {n for n in cls.__dict__ if not n.startswith("_")}
    return out


def _view_of(annotation: ast.expr | None) -> str | None:
    name = ast.unparse(annotation) if annotation is not None else ""
    return name if name in VIEWS else None


def _reads(node: ast.AST, holder: ast.expr) -> set[str]:
    """Attributes read on ``holder`` (a name, or ``self.field``) anywhere under ``node``."""
    key = ast.dump(holder)
    return {n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute) and ast.dump(n.value) == key}


def reads_outside_views(path: Path) -> list[str]:
    """``function: holder.attr (View)`` for every read of a view-typed value the view does not name."""
    tree = ast.parse(path.read_text())
    found: list[str] = []
    for scope in [tree, *(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef))]:
        functions = [n for n in scope.body if isinstance(n, ast.FunctionDef)]
        fields: dict[str, str] = {}  # self.<field> = <a view-typed __init__ argument>
        for fn in functions:
            typed = {a.arg: v for a in [*fn.args.args, *fn.args.kwonlyargs] if (v := _view_of(a.annotation))}
            if fn.name == "__init__":
                for st in ast.walk(fn):
                    if (isinstance(st, ast.Assign) and isinstance(st.value, ast.Name) and st.value.id in typed
                            and isinstance(t := st.targets[0], ast.Attribute)):
                        fields[t.attr] = typed[st.value.id]
            for arg, view in typed.items():
                holder = ast.Name(id=arg, ctx=ast.Load())
                found += [f"{fn.name}: {arg}.{a} ({view})" for a in sorted(_reads(fn, holder) - members(VIEWS[view]))]
        for fn in functions if isinstance(scope, ast.ClassDef) else []:
            for field, view in fields.items():
                holder = ast.Attribute(value=ast.Name(id="self", ctx=ast.Load()), attr=field, ctx=ast.Load())
                found += [f"{scope.name}.{fn.name}: self.{field}.{a} ({view})"
                          for a in sorted(_reads(fn, holder) - members(VIEWS[view]))]
    return found


READERS = sorted([*ENGINE.joinpath("checkpoint").glob("*.py"), *ENGINE.joinpath("surface").glob("*.py"),
                  ENGINE / "trial.py"])


@pytest.mark.parametrize("path", READERS, ids=lambda p: str(p.relative_to(ENGINE)))
def test_each_reader_reads_only_what_its_view_names(path: Path) -> None:
    wrong = reads_outside_views(path)
    assert not wrong, f"{path.relative_to(ENGINE.parent.parent)} reads past its view: {wrong}"


def test_the_read_check_sees_a_read_past_the_view(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text("def f(engine: Shards, x: int):\n    return engine.parts, engine.global_steps, x.real\n"
                      "class T:\n    def __init__(self, engine: Counters):\n        self._e = engine\n"
                      "    def g(self):\n        return self._e.global_steps, self._e.parts\n"
                      "class M:\n    def h(self: ModelView):\n        return self.config, self.scaler\n")
    assert sorted(reads_outside_views(source)) == ["T.g: self._e.parts (Counters)", "f: engine.global_steps (Shards)",
                                                   "h: self.scaler (ModelView)"]


def test_the_engine_has_every_member_of_every_view() -> None:
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 2))
    cfg = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3},
           "optimizer": {"type": "SGD", "params": {"lr": 0.1}}}
    with zerorun.simulate.world(1, rank=0, device="meta"):
        engine, *_ = zerorun.initialize(model=model, config=cfg)
        has = set(vars(engine)) | {n for cls in type(engine).__mro__ for n in vars(cls)}  # not the module's
        missing = {name: sorted(members(view) - has) for name, view in VIEWS.items()}
    assert len(VIEWS) >= 8 and not any(missing.values()), missing
