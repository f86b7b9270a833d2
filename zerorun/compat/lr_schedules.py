"""``deepspeed.runtime.lr_schedules``: DeepSpeed's scheduler classes over zerorun's schedules.

``WarmupLR(optimizer, warmup_min_lr=..., ...)`` and its siblings build the same
:class:`~zerorun.engine.schedulers.Scheduler` a config's ``scheduler`` block builds, so a
script (or accelerate, which checks ``VALID_LR_SCHEDULES`` by class name) can hand one to
``initialize(lr_scheduler=...)``. ``OneCycle`` and ``LRRangeTest`` are not implemented.
"""

from __future__ import annotations

from typing import Any

import torch

from zerorun.compat.unsupported import unsupported_class
from zerorun.engine.schedulers import Scheduler, build_scheduler

VALID_LR_SCHEDULES = ["LRRangeTest", "OneCycle", "WarmupLR", "WarmupDecayLR", "WarmupCosineLR"]
"""DeepSpeed's scheduler names (integrations test ``type(s).__name__`` against this list)."""


def _scheduler_class(name: str) -> type[Scheduler]:
    def __init__(self: Scheduler, optimizer: torch.optim.Optimizer, last_batch_iteration: int = -1,
                 **params: Any) -> None:
        built = build_scheduler(name, params, optimizer)
        Scheduler.__init__(self, optimizer, built.schedule)
        if last_batch_iteration >= 0:  # resuming: DeepSpeed's -1 means "not started"
            self.step(last_batch_iteration)

    return type(name, (Scheduler,), {"__init__": __init__, "__module__": __name__,
                                     "__doc__": f"DeepSpeed's {name}(optimizer, **params) on zerorun's schedule."})


WarmupLR = _scheduler_class("WarmupLR")
WarmupDecayLR = _scheduler_class("WarmupDecayLR")
WarmupCosineLR = _scheduler_class("WarmupCosineLR")
OneCycle = unsupported_class("OneCycle", "OneCycle learning-rate schedule (deepspeed.runtime.lr_schedules)")
LRRangeTest = unsupported_class("LRRangeTest", "LRRangeTest learning-rate schedule (deepspeed.runtime.lr_schedules)")

__all__ = ["VALID_LR_SCHEDULES", "LRRangeTest", "OneCycle", "WarmupCosineLR", "WarmupDecayLR", "WarmupLR"]
