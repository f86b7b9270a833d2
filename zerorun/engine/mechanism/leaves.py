"""Which modules stage 3 gathers as one unit with their whole subtree ("leaf" modules), from the config.

A module flagged ``_z3_leaf`` (DeepSpeed's attribute: ``deepspeed.utils.set_z3_leaf_modules`` sets
it, and so does this module) becomes one unit in :func:`zerorun.engine.mechanism.units.plan_units`.
Two ``zero_optimization`` keys flag modules at ``initialize``, with DeepSpeed 0.19.8's semantics:

* ``leaf_module``: ``classes`` (class names or fully qualified names; by default Hugging Face's
  MoE blocks, whose experts run data-dependently), ``names`` (as ``named_modules()`` gives them)
  and ``name_suffixes``. A customised entry that matches nothing is warned about.
* ``stage3_module_granularity_threshold``: a module's granularity is its parameters per layer
  (its parameter elements over the modules with parameters under it, itself counted once);
  containers (``ModuleList``, ``Sequential``, ...) and modules over 1e9 elements are never flagged.
  From the root down, the first module at or under the threshold is flagged and its subtree is not
  visited. Fewer, larger units mean fewer collectives for models of many small modules.
"""

from __future__ import annotations

import sys
import warnings
from typing import TYPE_CHECKING

from torch import nn

if TYPE_CHECKING:
    from zerorun.config.schema_zero import ZeroConfig

LEAF_ATTR = "_z3_leaf"
_MAX_LEAF = 1e9  # DeepSpeed's Z3_MAX_LEAF_SIZE: a leaf this large would keep too much gathered at once
_CONTAINERS = frozenset(nn.modules.container.__all__)


def flag_leaves(module: nn.Module, zero: ZeroConfig) -> list[nn.Module]:
    """Flag the modules the config names as leaves (stage 3, before the units are planned); returns them."""
    from zerorun.config.schema_zero import DEFAULT_LEAF_MODULE_CLASSES

    cfg = zero.leaf_module
    named = list(module.named_modules())
    found: dict[int, nn.Module] = {}
    for m in (m for _, m in named if _class_matches(m, cfg.classes)):
        found[id(m)] = m
    missing = []
    for wanted, exact in [*((n, True) for n in cfg.names), *((s, False) for s in cfg.name_suffixes)]:
        hits = [m for n, m in named if (n == wanted if exact else n.endswith(wanted))]
        missing += [] if hits else [wanted]
        found.update((id(m), m) for m in hits)
    customised = list(cfg.classes) != list(DEFAULT_LEAF_MODULE_CLASSES) or cfg.names or cfg.name_suffixes
    if missing:
        warnings.warn(f"zero_optimization.leaf_module: no module matches {missing}", RuntimeWarning, stacklevel=3)
    elif customised and not found:
        warnings.warn("zero_optimization.leaf_module matched no module: every module keeps its own unit",
                      RuntimeWarning, stacklevel=3)
    if zero.stage3_module_granularity_threshold > 0:
        for m in by_granularity(module, int(zero.stage3_module_granularity_threshold)):
            found[id(m)] = m
    for m in found.values():
        setattr(m, LEAF_ATTR, True)
    return list(found.values())


def _class_matches(module: nn.Module, classes: list[str]) -> bool:
    cls = type(module)
    return cls.__name__ in classes or f"{cls.__module__}.{cls.__qualname__}" in classes


def _numel(p: nn.Parameter) -> int:
    return int(getattr(p, "ds_numel", p.numel()))  # a zero.Init parameter rests empty: its full size


def granularities(module: nn.Module) -> dict[int, int]:
    """``id(module) -> parameters per layer`` for every module (``sys.maxsize``: never a leaf)."""
    out: dict[int, int] = {}

    def walk(m: nn.Module) -> tuple[int, int]:
        if not any(True for _ in m.parameters()):
            out[id(m)] = sys.maxsize
            return 0, 0
        params = sum(_numel(p) for p in m.parameters(recurse=False))
        children = list(m.children())
        if not children:
            out[id(m)] = sys.maxsize  # a torch leaf (Linear) is its own unit anyway
            return 1, params
        layers = 0
        for c in children:
            n, k = walk(c)
            layers, params = layers + n, params + k
        if type(m).__name__ in _CONTAINERS:
            out[id(m)] = sys.maxsize
            return layers, params
        layers += 1
        out[id(m)] = params // layers if params <= _MAX_LEAF else sys.maxsize
        return layers, params

    walk(module)
    return out


def by_granularity(module: nn.Module, threshold: int) -> list[nn.Module]:
    """The modules ``stage3_module_granularity_threshold`` flags: the first at or under it on each path down."""
    sizes = granularities(module)
    if min(sizes.values(), default=sys.maxsize) > threshold:
        warnings.warn(f"stage3_module_granularity_threshold {threshold} flags no module: the smallest granularity "
                      f"is {min(sizes.values())}; set it at least that high to take effect", RuntimeWarning,
                      stacklevel=4)
        return []
    picked: list[nn.Module] = []

    def visit(m: nn.Module) -> None:
        if not any(True for _ in m.parameters()):
            return
        if sizes[id(m)] <= threshold:
            picked.append(m)
            return
        for c in m.children():
            visit(c)

    visit(module)
    return picked
