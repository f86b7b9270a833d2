"""``set_z3_leaf_modules`` and friends: mark modules whose whole subtree gathers as one stage-3 unit.

MoE blocks (HF Mixtral, Qwen-MoE) run a data-dependent subset of their experts, so a
per-module gather order recorded on one step is wrong on the next. A module flagged
``_z3_leaf`` (DeepSpeed's attribute, so models flagged for DeepSpeed work unchanged) is
planned as one unit with all its descendants (:func:`zerorun.engine.mechanism.units.plan_units`):
everything under it is gathered before its forward. Flag modules before ``initialize``.
"""

from __future__ import annotations

from torch import nn

LEAF_ATTR = "_z3_leaf"


def z3_leaf_module(model: nn.Module) -> bool:
    """Whether ``model`` is flagged as a leaf."""
    return bool(getattr(model, LEAF_ATTR, False))


def z3_leaf_parameter(param: nn.Parameter) -> bool:
    """Whether ``param`` belongs to a leaf module (DeepSpeed marks it while it builds stage-3 hooks)."""
    return hasattr(param, "ds_z3_leaf_module")


def get_z3_leaf_modules(model: nn.Module) -> list[nn.Module]:
    return [m for m in model.modules() if z3_leaf_module(m)]


def set_z3_leaf_module(model: nn.Module, flag: bool) -> None:
    setattr(model, LEAF_ATTR, flag)


def _matches(module: nn.Module, wanted: type | str) -> bool:
    if isinstance(wanted, type):
        return isinstance(module, wanted)
    cls = type(module)
    return wanted in (cls.__name__, f"{cls.__module__}.{cls.__qualname__}")


def _flag_classes(model: nn.Module, classes: list[type] | list[str], flag: bool,
                  raise_if_not_found: bool) -> list[nn.Module]:
    if not all(isinstance(c, (type, str)) for c in classes):
        raise TypeError(f"leaf_module_classes must be a list of types or names, got {classes}")
    found = [m for m in model.modules() if any(_matches(m, c) for c in classes)]
    for m in found:
        set_z3_leaf_module(m, flag)
    if not found and raise_if_not_found:
        raise ValueError(f"No modules of type {classes} found in model {type(model).__name__}")
    return found


def set_z3_leaf_modules(model: nn.Module, leaf_module_classes: list[type] | list[str],
                        raise_if_not_found: bool = True) -> list[nn.Module]:
    """Flag every module of the given classes (types, class names or qualified names); returns them."""
    return _flag_classes(model, leaf_module_classes, True, raise_if_not_found)


def unset_z3_leaf_modules(model: nn.Module, leaf_module_classes: list[type] | list[str],
                          raise_if_not_found: bool = True) -> list[nn.Module]:
    return _flag_classes(model, leaf_module_classes, False, raise_if_not_found)


def _flag_named(model: nn.Module, wanted: list[str], flag: bool, raise_if_not_found: bool,
                match: str) -> tuple[list[nn.Module], list[str]]:
    named = dict(model.named_modules())
    found: list[nn.Module] = []
    missing: list[str] = []
    for key in wanted:
        hits = [m for n, m in named.items() if (n == key if match == "name" else n.endswith(key))]
        if not hits:
            missing.append(key)
        for m in hits:
            set_z3_leaf_module(m, flag)
            if all(m is not f for f in found):
                found.append(m)
    if missing and raise_if_not_found:
        raise ValueError(f"No modules {'named' if match == 'name' else 'matching suffixes'} {missing} found in "
                         f"model {type(model).__name__}")
    return found, missing


def set_z3_leaf_modules_by_name(model: nn.Module, module_names: list[str], flag: bool = True,
                                raise_if_not_found: bool = True) -> tuple[list[nn.Module], list[str]]:
    return _flag_named(model, module_names, flag, raise_if_not_found, "name")


def set_z3_leaf_modules_by_suffix(model: nn.Module, module_name_suffixes: list[str], flag: bool = True,
                                  raise_if_not_found: bool = True) -> tuple[list[nn.Module], list[str]]:
    return _flag_named(model, module_name_suffixes, flag, raise_if_not_found, "suffix")


__all__ = ["get_z3_leaf_modules", "set_z3_leaf_module", "set_z3_leaf_modules", "set_z3_leaf_modules_by_name",
           "set_z3_leaf_modules_by_suffix", "unset_z3_leaf_modules", "z3_leaf_module", "z3_leaf_parameter"]
