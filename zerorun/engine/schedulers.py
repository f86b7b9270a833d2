"""Learning-rate schedules with DeepSpeed's names, parameter names and step semantics.

``WarmupLR(warmup_min_lr, warmup_max_lr, warmup_num_steps, warmup_type)``,
``WarmupDecayLR(total_num_steps, ...WarmupLR's)``, and
``WarmupCosineLR(total_num_steps, warmup_min_ratio, warmup_num_steps, cos_min_ratio, warmup_type)``.
Each is a pure ``lr(last_batch_iteration, base_lr)`` formula plus a small stateful
wrapper the engine steps once per applied optimizer step (skipped steps do not advance it).

As in DeepSpeed 0.19.8, the counter starts at -1: the first optimizer step runs at the
"not started" lr (``warmup_min_lr`` for WarmupLR/WarmupDecayLR, 0 for WarmupCosineLR),
and the lr used by optimizer step k >= 1 is the formula at k - 1. ``warmup_num_steps``
below 2 counts as 2. ``WarmupLR``'s ``warmup_max_lr`` defaults to the optimizer's lr;
``WarmupDecayLR``'s to 0.001 (DeepSpeed's defaults).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from zerorun.engine.errors import EngineError


def _warmup_gamma(step: int, warmup_steps: int, warmup_type: str) -> float:
    """Fraction of the warm-up done at ``step`` (0-based), log or linear as in DeepSpeed."""
    n = max(2, warmup_steps)
    if step >= n:
        return 1.0
    if warmup_type == "linear":
        return step / n
    return math.log(step + 1) / math.log(n)  # "log", and DeepSpeed's fallback for unknown types


def _check_warmup_steps(value: Any) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise EngineError(f"scheduler warmup_num_steps must be a positive integer, got {value!r}",
                          "set scheduler.params.warmup_num_steps to e.g. 1000")


@dataclass(frozen=True)
class WarmupLR:
    warmup_min_lr: float = 0.0
    warmup_max_lr: float | None = None  # None: the optimizer's lr
    warmup_num_steps: int = 1000
    warmup_type: str = "log"

    def __post_init__(self) -> None:
        _check_warmup_steps(self.warmup_num_steps)

    def _gamma(self, step: int) -> float:
        return _warmup_gamma(step, self.warmup_num_steps, self.warmup_type)

    def lr(self, step: int, base_lr: float) -> float:
        if step < 0:  # before the first scheduler step
            return self.warmup_min_lr
        top = base_lr if self.warmup_max_lr is None else self.warmup_max_lr
        return self.warmup_min_lr + (top - self.warmup_min_lr) * self._gamma(step)


@dataclass(frozen=True)
class WarmupDecayLR(WarmupLR):
    total_num_steps: int = 1000
    warmup_max_lr: float | None = 0.001

    def _gamma(self, step: int) -> float:
        n = max(2, self.warmup_num_steps)
        if step < n:
            return super()._gamma(step)
        return max(0.0, (self.total_num_steps - step) / max(1.0, self.total_num_steps - n))


@dataclass(frozen=True)
class WarmupCosineLR:
    total_num_steps: int = 1000
    warmup_min_ratio: float = 0.0
    warmup_num_steps: int = 1000
    cos_min_ratio: float = 0.0001
    warmup_type: str = "log"

    def __post_init__(self) -> None:
        _check_warmup_steps(self.warmup_num_steps)

    def lr(self, step: int, base_lr: float) -> float:
        if step < 0:  # DeepSpeed's ratio before the first scheduler step is 0
            return 0.0
        n = max(2, self.warmup_num_steps)
        if step < n:
            ratio = _warmup_gamma(step, n, self.warmup_type)
            ratio = self.warmup_min_ratio + (1.0 - self.warmup_min_ratio) * ratio
        else:
            progress = min(1.0, (step - n + 1) / max(1, self.total_num_steps - n))
            ratio = (1.0 + math.cos(math.pi * progress)) / 2.0
            ratio = max(0.0, self.cos_min_ratio + (1.0 - self.cos_min_ratio) * ratio)
        return base_lr * ratio


_SCHEDULES = {"WarmupLR": WarmupLR, "WarmupDecayLR": WarmupDecayLR, "WarmupCosineLR": WarmupCosineLR}


class Scheduler:
    """Applies a schedule to every parameter group of an optimizer; DeepSpeed-like ``step``/``get_lr``."""

    def __init__(self, optimizer: torch.optim.Optimizer, schedule: Any) -> None:
        self.optimizer = optimizer
        self.schedule = schedule
        self.base_lrs = [g["lr"] for g in optimizer.param_groups]
        self.last_batch_iteration = -1  # DeepSpeed's start: the first step() makes it 0
        self._apply()

    def _apply(self) -> None:
        for g, base in zip(self.optimizer.param_groups, self.base_lrs, strict=True):
            g["lr"] = self.schedule.lr(self.last_batch_iteration, base)

    def step(self, last_batch_iteration: int | None = None) -> None:
        self.last_batch_iteration = (self.last_batch_iteration + 1 if last_batch_iteration is None
                                     else last_batch_iteration)
        self._apply()

    def get_lr(self) -> list[float]:
        return [g["lr"] for g in self.optimizer.param_groups]

    def get_last_lr(self) -> list[float]:
        return self.get_lr()

    def state_dict(self) -> dict[str, Any]:
        return {"last_batch_iteration": self.last_batch_iteration, "base_lrs": self.base_lrs}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.last_batch_iteration = state["last_batch_iteration"]
        self.base_lrs = state["base_lrs"]
        self._apply()


def build_scheduler(type_name: str, params: dict[str, Any], optimizer: torch.optim.Optimizer) -> Scheduler:
    cls = _SCHEDULES.get(type_name)
    if cls is None:
        raise EngineError(f"scheduler.type {type_name!r} is not supported by the engine",
                          f"use one of {', '.join(_SCHEDULES)}, or pass lr_scheduler= to initialize()")
    try:
        schedule = cls(**params)
    except TypeError as e:  # an unknown parameter name
        raise EngineError(f"scheduler.params for {type_name}: {e}",
                          f"use DeepSpeed's parameter names for {type_name}") from e
    return Scheduler(optimizer, schedule)
