"""The torch range the project declares, and the private torch APIs it leans on.

pyproject.toml declares the torch releases ``scripts/torch_matrix.sh`` ran the suites on (the table in
BENCHMARKS.md, "torch versions"). Every private torch API goes through one module,
:mod:`zerorun.torch_compat`, which picks per torch the private call or a fallback
(tests/test_torch_compat.py runs both on this torch). The source test below reads every module of the
packages (its syntax tree) and fails when one outside the shim touches a private torch name.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import torch

from zerorun import torch_compat

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("zerorun", "launcher")
SHIM = ROOT / "zerorun" / "torch_compat.py"
FLOOR = (2, 6)  # the oldest torch the matrix passed (2.6.0); torch 2.5 and older were not run
CEILING = (2, 16)  # excluded: 2.15.0 is the newest release the matrix ran

# private API -> (the shim's entry, the first torch with it in the form used, without it)
PRIVATE_APIS = {
    "torch._C._current_graph_task_id": ("current_graph_task_id", (2, 1), "required: stage-3 hooks tell forward from backward"),
    "torch._C.DisableTorchFunctionSubclass": ("call_without_subclass", (2, 0), "nn.Parameter.__torch_function__"),
    "torch._C._is_key_in_tls": ("detached_tls", (2, 1), "left as it is (with the three below)"),
    "torch._C._get_obj_in_tls": ("detached_tls", (2, 1), "left as it is"),
    "torch._C._remove_obj_from_tls": ("detached_tls", (2, 13), "left as it is (2.6.0 and 2.12.1 lack it)"),
    "torch._C._stash_obj_in_tls": ("detached_tls", (2, 1), "left as it is"),
    "torch.utils._pytree.tree_flatten": ("tree_leaves", (2, 0), "lists, tuples and mappings walked by the shim"),
    "torch.testing._internal.distributed.fake_pg.FakeStore": ("fake_store", (2, 1), "required by zerorun.simulate only"),
    "torch._dynamo": ("compiler_runtime_module", (2, 0), "named only (the memory baseline): torch.compiler"),
    "torch._disable_dynamo": ("disable_compile", (2, 1), "the same laziness around torch.compiler.disable"),
    "ProcessGroup._get_backend(device).options._timeout": ("group_timeout_s", (2, 0), "the caller's own timeout"),
    "torch.autograd.Variable._execution_engine.queue_callback": ("queue_backward_callback", (1, 0),
                                                                 "required: a plain loss.backward() is finished"),
    "Tensor._version": ("version_counter", (1, 0), "required: the copy and poison checks"),
    "Module._parameters": ("own_parameters", (1, 0), "named_parameters(recurse=False)"),
    "Module._buffers": ("own_buffers", (1, 0), "named_buffers(recurse=False)"),
    "Module._non_persistent_buffers_set": ("non_persistent_buffers", (1, 0), "the buffers state_dict leaves out"),
}
REQUIRED = {name for name, (_e, _v, without) in PRIVATE_APIS.items() if without.startswith("required")}


def _version(v: str) -> tuple[int, int]:
    major, minor = v.split("+")[0].split(".")[:2]
    return int(major), int(minor)


def test_the_declared_range_is_the_range_the_matrix_ran() -> None:
    # the dependency's string as pyproject.toml writes it (read as text: tomllib is Python 3.11+, and the
    # floor's suites also run on 3.10)
    project = (ROOT / "pyproject.toml").read_text().split("[project.optional-dependencies]")[0]
    spec = re.search(r'"(torch\b[^"]*)"', project.split("dependencies = [", 1)[1]).group(1)  # type: ignore[union-attr]
    assert spec.replace(" ", "") == f"torch>={FLOOR[0]}.{FLOOR[1]},<{CEILING[0]}.{CEILING[1]}", spec
    assert FLOOR <= _version(torch.__version__) < CEILING, f"torch {torch.__version__} is outside {spec}"
    bench = (ROOT / "BENCHMARKS.md").read_text()
    assert f"{FLOOR[0]}.{FLOOR[1]}.0" in bench and "torch_matrix.sh" in bench


def test_every_entry_is_in_the_shim_and_every_required_api_exists_within_the_floor() -> None:
    shim = SHIM.read_text()
    for name, (entry, needs, _without) in PRIVATE_APIS.items():
        assert callable(getattr(torch_compat, entry)), entry
        assert name.split(".")[-1].split("(")[0] in shim, f"{name} is listed but the shim does not use it"
        if name in REQUIRED:
            assert needs <= FLOOR, f"{name} (required) needs torch {needs}, above the declared floor {FLOOR}"
    assert torch_compat.current_graph_task_id() == -1  # the required ones run here
    assert torch_compat.version_counter(torch.zeros(1)) == 0


# -- the source test: no private torch name outside the shim ------------------------------------------

def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _chain(node: ast.AST) -> list[str] | None:
    """``a.b.c`` as ["a", "b", "c"]; None when the chain does not start at a name."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return [node.id, *reversed(parts)]


def private_torch_uses(source: str) -> list[str]:
    """Every private torch name ``source`` touches: imports of private torch modules or names, attribute
    chains from a name bound to torch with a private link, ``getattr``-style reads of one, module names
    as strings ("torch._dynamo"), and the private attributes of torch's objects the shim lists."""
    tree = ast.parse(source)
    torch_names: set[str] = set()
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "torch":
                    torch_names.add(alias.asname or "torch")
                    if any(_private(p) for p in alias.name.split(".")):
                        found.append(f"{node.lineno}: import {alias.name}")
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "torch":
            for alias in node.names:
                torch_names.add(alias.asname or alias.name)
                if any(_private(p) for p in [*node.module.split("."), alias.name]):
                    found.append(f"{node.lineno}: from {node.module} import {alias.name}")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            chain = _chain(node)
            if chain and chain[0] in torch_names and any(_private(p) for p in chain[1:]):
                found.append(f"{node.lineno}: {'.'.join(chain)}")
            elif node.attr in torch_compat.PRIVATE_ATTRIBUTES:
                found.append(f"{node.lineno}: .{node.attr}")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and len(node.args) >= 2 \
                and node.func.id in ("getattr", "hasattr", "setattr", "delattr") \
                and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str):
            chain = _chain(node.args[0])
            name = node.args[1].value
            if _private(name) and ((chain and chain[0] in torch_names) or name in torch_compat.PRIVATE_ATTRIBUTES):
                found.append(f"{node.lineno}: {node.func.id}(..., {name!r})")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and re.fullmatch(r"torch(\.\w+)*\._\w+(\.\w+)*", node.value):
            found.append(f"{node.lineno}: {node.value!r}")
    return sorted(set(found), key=lambda s: int(s.split(":")[0]))


def _package_sources() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py") if p != SHIM)


def test_no_module_outside_the_shim_touches_a_private_torch_api() -> None:
    offenders = {str(p.relative_to(ROOT)): uses for p in _package_sources() if (uses := private_torch_uses(p.read_text()))}
    assert not offenders, ("private torch APIs used outside zerorun/torch_compat.py (add an entry there, with a "
                           f"fallback, and call it): {offenders}")


@pytest.mark.parametrize("source", [
    "import torch\nx = torch._C._remove_obj_from_tls('k')",
    "import torch.distributed as dist\ndist.distributed_c10d._get_default_group()",
    "from torch.utils._pytree import tree_flatten",
    "from torch import _dynamo",
    "import torch._dynamo",
    "from torch import nn\nnn.Module._apply",
    "def f(t):\n    return t._version",
    "def f(m):\n    return m._buffers['x']",
    "def f(g, d):\n    return g._get_backend(d)",
    "import torch\nhasattr(torch._C, '_is_key_in_tls')",
    "import torch\ngetattr(torch, '_disable_dynamo')",
    "import importlib\nimportlib.import_module('torch._dynamo')",
    "@__import__('torch')._disable_dynamo\ndef f(): pass\nimport torch\nf = torch._disable_dynamo(f)",
])
def test_the_source_test_sees_each_form(source: str) -> None:
    assert private_torch_uses(source), source


def test_the_source_test_passes_public_code_and_the_project_s_own_privates() -> None:
    ok = ("import torch\nfrom torch import nn\nimport torch.distributed as dist\n"
          "x = torch.zeros(1)\ny = torch.__version__\nself_like = object()\nclass A:\n"
          "    def f(self):\n        return self._step, self._last_lr, dist.all_reduce\n")
    assert private_torch_uses(ok) == []
    assert private_torch_uses(SHIM.read_text())  # the shim itself is what the test would flag
