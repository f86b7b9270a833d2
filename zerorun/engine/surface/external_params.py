"""DeepSpeed's record of *external* parameters: ``module._external_params`` and ``module.ds_external_parameters()``.

A stage-3 module that returns a parameter (a bias its caller adds to its own output) hands
it to code outside its forward. The gather coordinator keeps such a parameter gathered for
the enclosing unit (:meth:`~zerorun.engine.mechanism.gather.GatherCoordinator._keep_returned`);
this file keeps DeepSpeed's bookkeeping of the same event, which scripts and tests written
against DeepSpeed read:

* every module of the engine has ``_external_params`` (``{id(param): param}``, empty at first)
  and ``ds_external_parameters()`` (its items);
* when a module's forward returns a parameter that no module still running has recorded,
  the innermost running module (the caller) records it, the returning module forgets it
  (it moved outward), and the parameter gets ``is_external_param = True``. A parameter
  already recorded by a running module stays where it is, so the record is the same from
  the second pass on.

The running modules are read from the Python frames of ``nn.Module.__call__`` on this
thread (:func:`zerorun.torch_compat.running_modules`), only when a module returns a
parameter (rare): forwards that return activations pay one ``isinstance`` per output.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch import nn

from zerorun.torch_compat import running_modules

if TYPE_CHECKING:
    from collections.abc import ItemsView


def _external_items(module: nn.Module) -> ItemsView[int, nn.Parameter]:
    return module.__dict__.setdefault("_external_params", {}).items()


def install(root: nn.Module) -> None:
    """Give every module of ``root`` an empty record and its ``ds_external_parameters()``."""
    for m in root.modules():
        m.__dict__.setdefault("_external_params", {})
        m.ds_external_parameters = _external_items.__get__(m)


def record_returned(param: nn.Parameter) -> None:
    """A module's forward (the innermost running one) returned ``param``: its caller records it, as DeepSpeed does."""
    running = running_modules()
    if len(running) < 2:  # returned by the outermost module: to the user, no module records it
        return
    done, callers = running[0], running[1:]
    key = id(param)
    if any(key in m.__dict__.get("_external_params", ()) for m in callers):
        return
    callers[0].__dict__.setdefault("_external_params", {})[key] = param
    done.__dict__.get("_external_params", {}).pop(key, None)
    param.is_external_param = True
