"""``deepspeed.runtime.lr_schedules``: DeepSpeed's scheduler classes over zerorun's schedules.

``WarmupLR(optimizer, warmup_min_lr, ...)`` and friends take DeepSpeed's constructor
arguments and step exactly as zerorun's engine steps its configured schedules (the
counter starts at -1, see :mod:`zerorun.engine.schedulers`).
"""

from __future__ import annotations

from typing import Any

import torch

from zerorun.compat.unsupported import unsupported_class
from zerorun.engine import schedulers as sched

WARMUP_LOG_RATE = "log"
WARMUP_LINEAR_RATE = "linear"
LR_RANGE_TEST, ONE_CYCLE, WARMUP_LR, WARMUP_DECAY_LR, WARMUP_COSINE_LR = (
    "LRRangeTest", "OneCycle", "WarmupLR", "WarmupDecayLR", "WarmupCosineLR")
VALID_LR_SCHEDULES = [LR_RANGE_TEST, ONE_CYCLE, WARMUP_LR, WARMUP_DECAY_LR, WARMUP_COSINE_LR]


class _Scheduler(sched.Scheduler):
    def __init__(self, optimizer: torch.optim.Optimizer, schedule: Any, last_batch_iteration: int) -> None:
        super().__init__(optimizer, schedule)
        if last_batch_iteration != -1:  # resuming: DeepSpeed leaves the optimizer's lr until the next step
            self.last_batch_iteration = last_batch_iteration


class WarmupLR(_Scheduler):
    def __init__(self, optimizer: torch.optim.Optimizer, warmup_min_lr: float = 0.0,
                 warmup_max_lr: float | None = None, warmup_num_steps: int = 1000,
                 warmup_type: str = WARMUP_LOG_RATE, last_batch_iteration: int = -1) -> None:
        super().__init__(optimizer, sched.WarmupLR(warmup_min_lr, warmup_max_lr, warmup_num_steps, warmup_type),
                         last_batch_iteration)


class WarmupDecayLR(_Scheduler):
    def __init__(self, optimizer: torch.optim.Optimizer, total_num_steps: int, warmup_min_lr: float = 0.0,
                 warmup_max_lr: float = 0.001, warmup_num_steps: int = 1000, warmup_type: str = WARMUP_LOG_RATE,
                 last_batch_iteration: int = -1) -> None:
        schedule = sched.WarmupDecayLR(warmup_min_lr=warmup_min_lr, warmup_max_lr=warmup_max_lr,
                                       warmup_num_steps=warmup_num_steps, warmup_type=warmup_type,
                                       total_num_steps=total_num_steps)
        super().__init__(optimizer, schedule, last_batch_iteration)


class WarmupCosineLR(_Scheduler):
    def __init__(self, optimizer: torch.optim.Optimizer, total_num_steps: int, warmup_min_ratio: float = 0.0,
                 warmup_num_steps: int = 1000, cos_min_ratio: float = 0.0001, warmup_type: str = WARMUP_LOG_RATE,
                 last_batch_iteration: int = -1) -> None:
        schedule = sched.WarmupCosineLR(total_num_steps, warmup_min_ratio, warmup_num_steps, cos_min_ratio,
                                        warmup_type)
        super().__init__(optimizer, schedule, last_batch_iteration)


OneCycle = unsupported_class("OneCycle", "OneCycle learning-rate schedule")
LRRangeTest = unsupported_class("LRRangeTest", "LRRangeTest learning-rate schedule")

__all__ = ["LRRangeTest", "OneCycle", "VALID_LR_SCHEDULES", "WARMUP_LINEAR_RATE", "WARMUP_LOG_RATE",
           "WarmupCosineLR", "WarmupDecayLR", "WarmupLR"]
