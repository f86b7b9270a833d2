"""Learning-rate schedules with DeepSpeed 0.19.8's names, constructors, attributes and values at every step.

``WarmupLR(optimizer, warmup_min_lr, warmup_max_lr, warmup_num_steps, warmup_type)``,
``WarmupDecayLR(optimizer, total_num_steps, ...WarmupLR's)``,
``WarmupCosineLR(optimizer, total_num_steps, warmup_min_ratio, warmup_num_steps, cos_min_ratio, warmup_type)``,
``OneCycle(optimizer, cycle_min_lr, cycle_max_lr, ...)`` (which also cycles Adam's beta1) and
``LRRangeTest(optimizer, ...)``. The engine builds the config's ``scheduler`` block with these
same classes (``build_scheduler``) and steps it once per applied optimizer step (a skipped
fp16 step does not advance it); ``deepspeed.runtime.lr_schedules`` is these classes too.

The counter starts at -1 (see :mod:`~zerorun.engine.training.scheduler_core`): the first
optimizer step runs at the "not started" lr (``warmup_min_lr`` for WarmupLR/WarmupDecayLR,
0 for WarmupCosineLR, ``cycle_min_lr`` for OneCycle, ``lr_range_test_min_lr`` for
LRRangeTest), and optimizer step k >= 1 at the formula for counter k - 1.
``warmup_num_steps`` below 2 counts as 2. Values given "per group" may be one number or a
list with one entry per parameter group. Unlike DeepSpeed, ``total_num_steps`` has a default
(1000), so a Hugging Face config's ``"auto"`` without a trainer to fill it still builds.
"""

from __future__ import annotations

import math
import warnings
from typing import Any, Protocol

from zerorun.engine.errors import EngineError
from zerorun.engine.training.one_cycle import OneCycle
from zerorun.engine.training.scheduler_core import (
    LOG,
    PerGroup,
    ScheduleError,
    Scheduler,
    as_number,
    check_positive_int,
    per_group,
    warmup_fraction,
    warmup_type_or_log,
)

__all__ = ["LRRangeTest", "LRSchedulerLike", "OneCycle", "ScheduleError", "Scheduler", "WarmupCosineLR",
           "WarmupDecayLR", "WarmupLR", "build_scheduler"]


class LRSchedulerLike(Protocol):
    """What the engine asks of a learning-rate scheduler: DeepSpeed's contract, an object with ``step()``
    (a checkpoint also carries its ``state_dict()`` where it has one)."""

    def step(self) -> object: ...


class WarmupLR(Scheduler):
    """From ``warmup_min_lr`` up to ``warmup_max_lr`` (default: each group's own lr) over ``warmup_num_steps``,
    log or linear, then flat. Both bounds are per group."""

    def __init__(self, optimizer: object, warmup_min_lr: PerGroup = 0.0, warmup_max_lr: PerGroup | None = None,
                 warmup_num_steps: int = 1000, warmup_type: str = LOG, last_batch_iteration: int = -1) -> None:
        check_positive_int(warmup_num_steps, "warmup_num_steps")
        super().__init__(optimizer, last_batch_iteration)
        if warmup_max_lr is None:
            warmup_max_lr = [g["lr"] for g in self.optimizer.param_groups]
        self.min_lrs = per_group(self.optimizer, warmup_min_lr, "warmup_min_lr")
        self.max_lrs = per_group(self.optimizer, warmup_max_lr, "warmup_max_lr")
        self.delta_lrs = [top - bottom for top, bottom in zip(self.max_lrs, self.min_lrs, strict=True)]
        self.warmup_num_steps = max(2, warmup_num_steps)
        self.warmup_type = warmup_type_or_log(warmup_type)
        self._start()

    def _after_warmup(self) -> float:
        return 1.0

    def _gamma(self) -> float:
        if self.last_batch_iteration < self.warmup_num_steps:
            return warmup_fraction(self.last_batch_iteration, self.warmup_num_steps, self.warmup_type)
        return self._after_warmup()

    def get_lr(self) -> list[float]:
        if self.last_batch_iteration < 0:  # not started
            return list(self.min_lrs)
        gamma = self._gamma()
        return [bottom + delta * gamma for bottom, delta in zip(self.min_lrs, self.delta_lrs, strict=True)]


class WarmupDecayLR(WarmupLR):
    """WarmupLR, then a linear decay to 0 at ``total_num_steps``."""

    def __init__(self, optimizer: object, total_num_steps: int = 1000, warmup_min_lr: PerGroup = 0.0, warmup_max_lr: PerGroup = 0.001,
                 warmup_num_steps: int = 1000, warmup_type: str = LOG, last_batch_iteration: int = -1) -> None:
        self.total_num_steps = total_num_steps
        super().__init__(optimizer, warmup_min_lr, warmup_max_lr, warmup_num_steps, warmup_type,
                         last_batch_iteration)
        if total_num_steps < self.warmup_num_steps:
            warnings.warn(f"scheduler total_num_steps {total_num_steps} is less than warmup_num_steps "
                          f"{warmup_num_steps}", stacklevel=2)

    def _after_warmup(self) -> float:
        remaining = float(self.total_num_steps - self.last_batch_iteration)
        return max(0.0, remaining / float(max(1.0, self.total_num_steps - self.warmup_num_steps)))


class WarmupCosineLR(Scheduler):
    """Each group's own lr times a ratio: from ``warmup_min_ratio`` up to 1 over ``warmup_num_steps``, then a
    cosine down to ``cos_min_ratio`` at ``total_num_steps``, where it stays."""

    def __init__(self, optimizer: object, total_num_steps: int = 1000, warmup_min_ratio: float = 0.0,
                 warmup_num_steps: int = 1000, cos_min_ratio: float = 0.0001, warmup_type: str = LOG,
                 last_batch_iteration: int = -1) -> None:
        check_positive_int(warmup_num_steps, "warmup_num_steps")
        super().__init__(optimizer, last_batch_iteration)
        self.total_num_steps = total_num_steps
        self.cos_min_ratio = cos_min_ratio
        self.warmup_type = warmup_type_or_log(warmup_type)
        self.warmup_min_ratio = warmup_min_ratio
        self.warmup_num_steps = max(2, warmup_num_steps)
        if total_num_steps < self.warmup_num_steps:
            warnings.warn(f"scheduler total_num_steps {total_num_steps} is less than warmup_num_steps "
                          f"{warmup_num_steps}", stacklevel=2)
        self.org_lrs = [as_number(g["lr"]) for g in self.optimizer.param_groups]
        self._start()

    def get_lr_ratio(self) -> float:
        """The factor on every group's lr at the counter."""
        step = self.last_batch_iteration
        if step < 0:
            return 0.0
        if step < self.warmup_num_steps:
            done = warmup_fraction(step, self.warmup_num_steps, self.warmup_type)
            return self.warmup_min_ratio + done * (1.0 - self.warmup_min_ratio)
        # the first step after warm-up already counts as progress 1/(total - warmup); clamped at the end
        progress = min(1.0, (step - self.warmup_num_steps + 1) / max(1, self.total_num_steps - self.warmup_num_steps))
        ratio = (1 + math.cos(math.pi * progress)) / 2
        return max(0.0, self.cos_min_ratio + (1.0 - self.cos_min_ratio) * ratio)

    def get_lr(self) -> list[float]:
        if self.last_batch_iteration < 0:
            return [0.0 for _ in self.org_lrs]
        ratio = self.get_lr_ratio()
        return [lr * ratio for lr in self.org_lrs]


class LRRangeTest(Scheduler):
    """``lr_range_test_min_lr * (1 + step_rate * (counter + 1) / step_size)``, the quotient floored with
    ``lr_range_test_staircase``; the min lr is per group."""

    def __init__(self, optimizer: object, lr_range_test_min_lr: PerGroup = 1e-3, lr_range_test_step_size: int = 2000,
                 lr_range_test_step_rate: float = 1.0, lr_range_test_staircase: bool = False,
                 last_batch_iteration: int = -1) -> None:
        super().__init__(optimizer, last_batch_iteration)
        self.min_lr = per_group(self.optimizer, lr_range_test_min_lr, "lr_range_test_min_lr")
        check_positive_int(lr_range_test_step_size, "lr_range_test_step_size")
        self.step_size = lr_range_test_step_size
        self.step_rate = lr_range_test_step_rate
        self.staircase = lr_range_test_staircase
        self._start()

    def _interval(self) -> float:
        interval = float(self.last_batch_iteration + 1) / self.step_size
        return math.floor(interval) if self.staircase else interval

    def get_lr(self) -> list[float]:
        increase = 1 + self.step_rate * self._interval()
        return [lr * increase for lr in self.min_lr]


_SCHEDULES: dict[str, type[Scheduler]] = {"WarmupLR": WarmupLR, "WarmupDecayLR": WarmupDecayLR,
                                          "WarmupCosineLR": WarmupCosineLR, "OneCycle": OneCycle,
                                          "LRRangeTest": LRRangeTest}


def build_scheduler(type_name: str, params: dict[str, Any], optimizer: object) -> Scheduler:
    """The config's ``scheduler`` block as DeepSpeed's engine builds it: ``type(optimizer, **params)``."""
    cls = _SCHEDULES.get(type_name)
    if cls is None:
        raise EngineError(f"scheduler.type {type_name!r} is not supported by the engine",
                          f"use one of {', '.join(_SCHEDULES)}, or pass lr_scheduler= to initialize()")
    try:
        return cls(optimizer, **params)
    except TypeError as e:  # an unknown or missing parameter name
        raise EngineError(f"scheduler.params for {type_name}: {e}",
                          f"use DeepSpeed's parameter names for {type_name}") from e
