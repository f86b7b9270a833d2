"""DeepSpeed's stage-3 type of a module's parameter dict: ``ZeROOrderedDict`` and ``ensure_zero_ordered_dict``.

DeepSpeed's stage 3 replaces every module's ``_parameters`` with a ``ZeROOrderedDict`` (its
original dict kept as ``module._original_parameters``), and converts a module attached
after ``initialize`` too; scripts that attach modules late (adapters injected after
``prepare``) convert them the same way, or test for the type. zerorun does the same, with
a difference of purpose: DeepSpeed's dict gathers a released parameter when forward reads
it, while zerorun's parameters gather themselves when used
(:mod:`zerorun.engine.mechanism.guard`), so this dict is a marker only. It overrides no
lookup: ``module.weight`` reads it with the dict's own C code, so a forward costs what it
did. ``_in_forward`` is there (scripts test for it) and stays False: nothing here reads it.

A module attached under a converted module (``engine.module.late = nn.Linear(...)``, at
any depth) is converted as it is attached, by a module-registration hook (torch's public
``register_module_module_registration_hook``, installed once per process): a forward
pays nothing to find late modules. A late module is not sharded (as on DeepSpeed): its
parameters stay whole and outside the optimizer.
"""

from __future__ import annotations

from collections import OrderedDict

from torch import nn
from torch.nn.modules.module import register_module_module_registration_hook

from zerorun.torch_compat import own_parameters, set_own_parameters

_hooked: list[bool] = [False]  # the registration hook is process-wide: installed once


class ZeROOrderedDict(OrderedDict):
    """``ZeROOrderedDict(parent_module, ...)``: an ``OrderedDict`` of a stage-3 module's own parameters."""

    def __init__(self, parent_module: nn.Module | None = None, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._parent_module = parent_module
        self._in_forward = False


def ensure_zero_ordered_dict(module: object) -> None:
    """Make ``module``'s parameter dict a :class:`ZeROOrderedDict` unless it is one already (same keys and
    parameters, same order). The first dict replaced stays as ``module._original_parameters``; an existing
    one is kept. Nothing happens to what is not a module, or has no such dict."""
    if not isinstance(module, nn.Module):
        return
    params = own_parameters(module)
    if isinstance(params, ZeROOrderedDict) or not isinstance(params, dict):
        return
    converted = ZeROOrderedDict(module)
    converted.update(params)
    if not set_own_parameters(module, converted):
        return
    if "_original_parameters" not in module.__dict__:
        module.__dict__["_original_parameters"] = params


def _convert_late(parent: nn.Module, _name: str, child: nn.Module | None) -> None:
    """A module is attached: under a converted one, it and its subtree are converted too."""
    if child is not None and isinstance(own_parameters(parent), ZeROOrderedDict):
        for m in child.modules():
            ensure_zero_ordered_dict(m)


def install(root: nn.Module) -> None:
    """Convert every module of ``root`` (stage 3's engine does, at ``initialize``), and from now on the modules
    attached under them."""
    for m in root.modules():
        ensure_zero_ordered_dict(m)
    if not _hooked[0]:
        register_module_module_registration_hook(_convert_late)
        _hooked[0] = True
