"""What scripts ask of ``engine.optimizer`` as of DeepSpeed's ZeRO optimizer: ``needs_scaler()``, and
whether it is one (``isinstance(opt, deepspeed.runtime.base_optimizer.ZeROOptimizer)``).

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
