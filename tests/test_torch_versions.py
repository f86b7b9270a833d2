"""The torch the project declares, and the private torch APIs the engine leans on.

pyproject.toml's floor is the torch the engine suites ran on (2.13.0, the only build this
project's CI installs; BENCHMARKS.md names it): an older torch was never run. Each private
API below is named with the first torch that has it in the form used, and whether the code
falls back without it; the test fails when the source uses a private ``torch._*`` name this
list does not hold, when the installed torch lacks one, or when the floor is below one's need.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import tomllib
import torch

ROOT = Path(__file__).resolve().parent.parent
FLOOR = (2, 13)

# name -> (first torch with it in the form used, how the code copes without it)
PRIVATE_APIS = {
    "torch._C._current_graph_task_id": ((2, 1), "required: stage-3 hooks tell forward from backward"),
    "torch._C.DisableTorchFunctionSubclass": ((2, 0), "required: the sharded-parameter guard"),
    "torch._C._is_key_in_tls": ((2, 1), "optional (hasattr): collectives issued outside backward's TLS object"),
    "torch._C._get_obj_in_tls": ((2, 1), "optional, with _is_key_in_tls"),
    "torch._C._remove_obj_from_tls": ((2, 1), "optional, with _is_key_in_tls"),
    "torch._C._stash_obj_in_tls": ((2, 1), "optional, with _is_key_in_tls"),
    "torch.utils._pytree.tree_flatten": ((2, 0), "required: stage-3 hooks find the tensors of a module's inputs"),
    "torch.testing._internal.distributed.fake_pg.FakeStore": ((2, 1), "required by zerorun.simulate only"),
    "torch._dynamo": ((2, 0), "named only: the memory baseline counts its import"),
    "torch._disable_dynamo": ((2, 1), "required: the engine's compile markers, imported lazily (small commands skip the compiler)"),
}
# ProcessGroup._get_backend(device).options._timeout: optional (suppressed), the lane's wait timeout
ATTRIBUTE_APIS = {"_get_backend": ((2, 0), "optional (AttributeError suppressed): the shared lane's timeout")}


def _resolve(name: str) -> object:
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(name)


def test_the_floor_is_the_torch_the_suites_ran_on() -> None:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    spec = next(d for d in deps if re.match(r"torch\b", d))
    floor = tuple(int(x) for x in re.search(r">=\s*([\d.]+)", spec).group(1).split(".")[:2])
    assert floor == FLOOR, f"pyproject.toml declares {spec}; the engine suites ran on {FLOOR}"
    assert tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2]) >= FLOOR
    assert "2.13" in (ROOT / "BENCHMARKS.md").read_text()


def test_every_private_api_exists_here_and_is_within_the_floor() -> None:
    for name, (needs, _why) in {**PRIVATE_APIS}.items():
        _resolve(name)  # raises if this torch lacks it
        assert needs <= FLOOR, f"{name} needs torch {needs}, above the declared floor {FLOOR}"
    assert hasattr(torch.distributed.ProcessGroup, "_get_backend")


def test_the_source_uses_no_private_torch_api_off_the_list() -> None:
    pattern = re.compile(r"torch(?:\.[A-Za-z]\w*)*\._\w+(?:\.\w+)*")
    used: set[str] = set()
    for path in (ROOT / "zerorun").rglob("*.py"):
        for m in pattern.finditer(path.read_text()):
            name = m.group(0)
            if name.startswith("torch.__"):
                continue
            used.add(next((k for k in PRIVATE_APIS if name == k or name.startswith(k + ".") or k.startswith(name)),
                          name))
    unknown = sorted(used - set(PRIVATE_APIS))
    assert not unknown, f"private torch APIs used but not listed (add them with the version each needs): {unknown}"
    assert "torch._C._autograd._unsafe_set_version_counter" not in used  # its tuple form needs torch 2.7
