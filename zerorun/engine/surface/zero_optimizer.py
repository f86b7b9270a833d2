"""What scripts ask of ``engine.optimizer`` as of DeepSpeed's ZeRO optimizer: ``needs_scaler()``, whether
it is one (``isinstance(opt, deepspeed.runtime.base_optimizer.ZeROOptimizer)``), and the torch optimizer
it wraps (``opt.optimizer``).

DeepSpeed 0.19.8's manual backward reads them: ``if engine.optimizer.needs_scaler(): loss =
engine.scale(loss)``. ``needs_scaler()`` is True under fp16's dynamic loss scale alone (DeepSpeed's
rule: a static scale, bf16 and fp32 say False). zerorun steps the script's own optimizer, so it
cannot be an instance of DeepSpeed's class; the compatibility layer's ``ZeROOptimizer`` answers
``isinstance`` from :data:`ZERO_OPTIMIZERS`, the optimizers of engines at ZeRO stages 1-3.
"""

from __future__ import annotations

import weakref

import torch

ZERO_OPTIMIZERS: weakref.WeakSet[torch.optim.Optimizer] = weakref.WeakSet()
"""The optimizers of engines at ZeRO stages 1-3 (held weakly: the engine owns them)."""


def expose(optimizer: torch.optim.Optimizer, sharded: bool, dynamic_scale: bool) -> None:
    """Give ``optimizer`` DeepSpeed's ``needs_scaler()``; where it steps shards (stages 1-3), count it as a
    ZeRO optimizer."""
    optimizer.needs_scaler = lambda: dynamic_scale  # type: ignore[attr-defined]
    if sharded:
        ZERO_OPTIMIZERS.add(optimizer)
        optimizer.optimizer = BaseOptimizer(optimizer)  # type: ignore[attr-defined]


class BaseOptimizer:
    """``optimizer.optimizer``: DeepSpeed's ZeRO optimizer wraps the torch optimizer that steps the fp32
    partitions; zerorun steps with that optimizer itself, so this is a view of it: every attribute read
    and written goes to it (``state``, ``param_groups``, ``state_dict()``, ``load_state_dict()``), and
    ``isinstance`` sees its class. It has no ``optimizer`` of its own, so code that unwraps
    ``.optimizer`` until there is none stops here instead of looping; it holds the optimizer weakly
    (the optimizer holds the view)."""

    __slots__ = ("_ref",)

    def __init__(self, target: torch.optim.Optimizer) -> None:
        object.__setattr__(self, "_ref", weakref.ref(target))

    @property
    def _target(self) -> torch.optim.Optimizer:
        target = object.__getattribute__(self, "_ref")()
        if target is None:
            raise ReferenceError("the optimizer this view wraps is gone")
        return target

    @property  # type: ignore[misc]
    def __class__(self) -> type:  # isinstance(view, torch.optim.Adam) as for the optimizer itself
        return type(self._target)

    def __getattr__(self, name: str) -> object:
        if name == "optimizer":
            raise AttributeError(f"{type(self._target).__name__} is the base optimizer: it wraps none")
        return getattr(self._target, name)

    def __setattr__(self, name: str, value: object) -> None:
        setattr(self._target, name, value)

    def __repr__(self) -> str:
        return repr(self._target)
