"""Device discipline, read from the source: every allocation in the engine names its device.

A factory call without ``device=`` allocates on the CPU (or on whatever default device a
user's script set); on a GPU run that is a host tensor where the engine meant a device one,
and a silent host sync or a cross-device error later. ``*_like`` and ``new_*`` inherit a
device and are not factory calls here.
"""

from __future__ import annotations

import ast
from pathlib import Path

import zerorun.engine

FACTORIES = frozenset({"empty", "zeros", "ones", "full", "tensor", "arange", "rand", "randn", "randint",
                       "empty_strided", "eye", "linspace", "as_tensor", "scalar_tensor", "randperm"})
ENGINE = Path(zerorun.engine.__file__).parent


def _unplaced(path: Path) -> list[str]:
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        func = node.func
        if not (isinstance(func.value, ast.Name) and func.value.id == "torch" and func.attr in FACTORIES):
            continue
        if not any(k.arg == "device" or k.arg is None for k in node.keywords):  # **kwargs may carry it
            out.append(f"{path.relative_to(ENGINE.parent.parent)}:{node.lineno} torch.{func.attr}(...)")
    return out


def test_every_engine_allocation_names_its_device() -> None:
    missing = [hit for path in sorted(ENGINE.rglob("*.py")) for hit in _unplaced(path)]
    assert not missing, "allocations without device=:\n" + "\n".join(missing)


def test_the_check_sees_a_missing_device(tmp_path: Path) -> None:
    src = tmp_path / "zerorun" / "engine" / "x.py"
    src.parent.mkdir(parents=True)
    src.write_text("import torch\na = torch.zeros(3)\nb = torch.zeros(3, device=d)\nc = torch.zeros_like(a)\n")
    global ENGINE
    saved, ENGINE = ENGINE, src.parent
    try:
        assert _unplaced(src) == ["zerorun/engine/x.py:2 torch.zeros(...)"]
    finally:
        ENGINE = saved
