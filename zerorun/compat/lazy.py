"""Unsupported ``deepspeed`` modules import, and fail where a feature is *used*.

DeepSpeed scripts import whole subpackages at the top (CIFAR imports ``deepspeed.moe.utils``
without ``--moe``), so an import must succeed; the named error belongs to the first
use. Two pieces make that true:

* :func:`unsupported_names` is the module-level ``__getattr__`` (PEP 562) of each
  unsupported package: any public name it lacks is a stand-in class whose construction
  (or call) raises :class:`~zerorun.errors.UnsupportedFeature` naming the
  feature; ``isinstance(x, Stand_in)`` is False, which is DeepSpeed's answer for a model
  without that feature.
* :class:`UnsupportedFinder`, last on ``sys.meta_path``, turns any ``deepspeed.*`` module
  that has no file here into such a module (so ``deepspeed.pipe.engine`` or
  ``deepspeed.moe.sharded_moe`` import too), named after its nearest unsupported parent.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from collections.abc import Callable
from typing import Any

from zerorun.compat import SITEDIR
from zerorun.errors import unsupported_class

FEATURE_ATTR = "__zerorun_unsupported__"
"""Set on an unsupported module: the feature its stand-ins name (submodules inherit it)."""


def unsupported_names(feature: str) -> Callable[[str], Any]:
    """A module ``__getattr__``: public names become stand-ins for ``feature``; dunders stay missing."""
    made: dict[str, type] = {}

    def __getattr__(name: str) -> Any:
        if name.startswith("__"):  # import machinery, pickle and star-imports probe these
            raise AttributeError(name)
        if name not in made:
            made[name] = unsupported_class(name, f"{feature}: {name}")
        return made[name]

    return __getattr__


def _feature_of(fullname: str) -> str:
    """The nearest loaded parent's feature, else the module's own name."""
    parts = fullname.split(".")
    for end in range(len(parts) - 1, 0, -1):
        parent = sys.modules.get(".".join(parts[:end]))
        feature = getattr(parent, FEATURE_ATTR, None) if parent is not None else None
        if isinstance(feature, str):
            return feature
    return fullname


class _Loader(importlib.abc.Loader):
    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return types.ModuleType(spec.name, f"Not implemented by zerorun: {spec.name}.")

    def exec_module(self, module: types.ModuleType) -> None:
        feature = _feature_of(module.__name__)
        setattr(module, FEATURE_ATTR, feature)
        module.__getattr__ = unsupported_names(feature)  # type: ignore[method-assign]


class UnsupportedFinder(importlib.abc.MetaPathFinder):
    """Finds ``deepspeed.*`` modules that have no file, when ``deepspeed`` is zerorun's package."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        top = sys.modules.get("deepspeed")
        if not fullname.startswith("deepspeed.") or top is None:
            return None
        if not str(getattr(top, "__file__", "")).startswith(str(SITEDIR)):  # a real DeepSpeed: not ours
            return None
        spec = importlib.machinery.ModuleSpec(fullname, _Loader(), is_package=True)
        spec.submodule_search_locations = []
        return spec


def install_finder() -> None:
    """Append the finder once: files on disk always win, it only answers what they lack."""
    if not any(isinstance(f, UnsupportedFinder) for f in sys.meta_path):
        sys.meta_path.append(UnsupportedFinder())
