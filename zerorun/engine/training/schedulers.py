"""Learning-rate schedules with DeepSpeed's names, parameter names and step semantics.

``WarmupLR(warmup_min_lr, warmup_max_lr, warmup_num_steps, warmup_type)``,
``WarmupDecayLR(total_num_steps, ...WarmupLR's)``, and
``WarmupCosineLR(total_num_steps, warmup_min_ratio, warmup_num_steps, cos_min_ratio, warmup_type)``,
``OneCycle(cycle_min_lr, cycle_max_lr, ...)`` (with momentum cycling) and ``LRRangeTest(...)``.
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
from typing import Any, Protocol

import torch

from zerorun.engine.errors import EngineError


class LRSchedulerLike(Protocol):
    """What the engine asks of a learning-rate scheduler: DeepSpeed's contract, an object with ``step()``
    (a checkpoint also carries its ``state_dict()`` where it has one)."""

    def step(self) -> object: ...


class Schedule(Protocol):
    """A schedule :class:`Scheduler` applies: the learning rate at ``step`` from a group's base rate
    (:class:`OneCycle` also cycles ``betas``)."""

    def lr(self, step: int, base_lr: float) -> float: ...


def _warmup_gamma(step: int, warmup_steps: int, warmup_type: str) -> float:
    """Fraction of the warm-up done at ``step`` (0-based), log or linear as in DeepSpeed."""
    n = max(2, warmup_steps)
    if step >= n:
        return 1.0
    if warmup_type == "linear":
        return step / n
    return math.log(step + 1) / math.log(n)  # "log", and DeepSpeed's fallback for unknown types


def _check_warmup_steps(value: object) -> None:
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


@dataclass(frozen=True)
class OneCycle:
    """DeepSpeed's 1-cycle policy: lr up from ``cycle_min_lr`` to ``cycle_max_lr`` over the first step size,
    back down over the second, then (with ``decay_step_size`` and a rate) decayed. With ``cycle_momentum``
    and an optimizer that has ``betas``, beta1 cycles inversely between the momentum bounds; as in
    DeepSpeed 0.19.8, beta2 is then set to 0.99."""

    cycle_min_lr: float
    cycle_max_lr: float
    decay_lr_rate: float = 0.0
    cycle_first_step_size: int = 2000
    cycle_second_step_size: int | None = None
    cycle_first_stair_count: int = 0
    cycle_second_stair_count: int | None = None
    decay_step_size: int = 0
    cycle_momentum: bool = True
    cycle_min_mom: float = 0.8
    cycle_max_mom: float = 0.9
    decay_mom_rate: float = 0.0

    def __post_init__(self) -> None:
        for name in ("cycle_min_lr", "cycle_max_lr", "cycle_min_mom", "cycle_max_mom"):
            if isinstance(getattr(self, name), (list, tuple)):
                raise EngineError(f"scheduler OneCycle: per-group lists for {name} are not supported",
                                  f"give {name} one number for every parameter group")
        if self.cycle_first_step_size <= 0 or (self.cycle_second_step_size or 0) < 0:
            raise EngineError("scheduler OneCycle: cycle_first_step_size must be positive and "
                              "cycle_second_step_size non-negative", "set e.g. cycle_first_step_size to 1000")

    @property
    def _sizes(self) -> tuple[float, float]:
        first = float(self.cycle_first_step_size)
        return first, first if self.cycle_second_step_size is None else float(self.cycle_second_step_size)

    def _scale(self, step: int) -> float:
        first, second = self._sizes
        total, it = first + second, step + 1
        ratio = first / total
        x = 1.0 + it / total - math.floor(1 + it / total)
        if x <= ratio:
            scale, stairs = x / ratio, self.cycle_first_stair_count
        else:
            scale = (x - 1) / (ratio - 1)
            stairs = (self.cycle_first_stair_count if self.cycle_second_stair_count is None
                      else self.cycle_second_stair_count)
        if stairs > 0:
            ci = it % total
            position = ci * stairs / first if ci <= first else (total - ci) * stairs / second
            scale = math.floor(position) / stairs
        return scale

    def _decay_interval(self, step: int) -> float | None:
        """Steps into the decay phase over ``decay_step_size``; None while cycling or without decay."""
        total = sum(self._sizes)
        if step < total or self.decay_step_size == 0:
            return None
        return (step - total + 1) / self.decay_step_size

    def lr(self, step: int, base_lr: float) -> float:
        if step < sum(self._sizes):
            return self.cycle_min_lr + (self.cycle_max_lr - self.cycle_min_lr) * self._scale(step)
        interval = self._decay_interval(step)
        if interval is None or self.decay_lr_rate == 0:
            return self.cycle_min_lr
        return self.cycle_min_lr / (1 + self.decay_lr_rate * interval)

    def betas(self, step: int) -> tuple[float, float] | None:
        if not self.cycle_momentum:
            return None
        if step < 0:  # DeepSpeed's start: the lower bound
            return self.cycle_min_mom, 0.99
        if step < sum(self._sizes):
            return self.cycle_max_mom - (self.cycle_max_mom - self.cycle_min_mom) * self._scale(step), 0.99
        interval = self._decay_interval(step)
        if interval is None or self.decay_mom_rate == 0:
            return self.cycle_max_mom, 0.99
        return self.cycle_max_mom * (1 + self.decay_mom_rate * interval), 0.99


@dataclass(frozen=True)
class LRRangeTest:
    """DeepSpeed's LR range test: ``min_lr * (1 + step_rate * (step + 1) / step_size)`` (floored with staircase)."""

    lr_range_test_min_lr: float = 1e-3
    lr_range_test_step_size: int = 2000
    lr_range_test_step_rate: float = 1.0
    lr_range_test_staircase: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.lr_range_test_min_lr, (list, tuple)):
            raise EngineError("scheduler LRRangeTest: per-group lists for lr_range_test_min_lr are not supported",
                              "give lr_range_test_min_lr one number for every parameter group")
        if not isinstance(self.lr_range_test_step_size, int) or self.lr_range_test_step_size <= 0:
            raise EngineError(f"lr_range_test_step_size must be a positive integer, got "
                              f"{self.lr_range_test_step_size!r}", "set scheduler.params.lr_range_test_step_size")

    def lr(self, step: int, base_lr: float) -> float:
        interval = (step + 1) / self.lr_range_test_step_size
        if self.lr_range_test_staircase:
            interval = math.floor(interval)
        return self.lr_range_test_min_lr * (1 + self.lr_range_test_step_rate * interval)


_SCHEDULES = {"WarmupLR": WarmupLR, "WarmupDecayLR": WarmupDecayLR, "WarmupCosineLR": WarmupCosineLR,
              "OneCycle": OneCycle, "LRRangeTest": LRRangeTest}


class Scheduler:
    """Applies a schedule to every parameter group of an optimizer; DeepSpeed-like ``step``/``get_lr``."""

    def __init__(self, optimizer: torch.optim.Optimizer, schedule: Schedule) -> None:
        self.optimizer = optimizer
        self.schedule = schedule
        self.base_lrs = [g["lr"] for g in optimizer.param_groups]
        self.last_batch_iteration = -1  # DeepSpeed's start: the first step() makes it 0
        self._apply()

    def _apply(self) -> None:
        betas = getattr(self.schedule, "betas", None)  # OneCycle cycles momentum too, where there are betas
        betas = betas(self.last_batch_iteration) if betas is not None and "betas" in self.optimizer.defaults \
            else None
        for g, base in zip(self.optimizer.param_groups, self.base_lrs, strict=True):
            g["lr"] = self.schedule.lr(self.last_batch_iteration, base)
            if betas is not None:
                g["betas"] = betas

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
