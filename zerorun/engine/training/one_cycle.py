"""DeepSpeed's 1-cycle policy (Smith, arXiv:1803.09820): the lr up and down once, then an optional decay.

The lr climbs from ``cycle_min_lr`` to ``cycle_max_lr`` over ``cycle_first_step_size`` steps
and comes back over ``cycle_second_step_size`` (default: the first), in stairs when a stair
count is given; after the cycle it is ``cycle_min_lr / (1 + decay_lr_rate * k / decay_step_size)``
(k steps into the decay; no decay when either is 0). With ``cycle_momentum`` and an optimizer
that has ``betas``, beta1 moves the other way between ``cycle_max_mom`` and ``cycle_min_mom``
and grows by ``decay_mom_rate`` after the cycle. As in DeepSpeed 0.19.8, beta2 is then set to
0.99, and a starting scheduler writes ``cycle_min_mom`` (not the formula's ``cycle_max_mom``)
into the optimizer until its first ``step()``. Bounds are per group.
"""

from __future__ import annotations

import math
import warnings

from zerorun.engine.training.scheduler_core import PerGroup, ScheduleError, Scheduler, per_group, write_lrs

BETA2 = 0.99  # DeepSpeed's OneCycle pins Adam's beta2 here while it cycles beta1


class OneCycle(Scheduler):
    def __init__(self, optimizer: object, cycle_min_lr: PerGroup, cycle_max_lr: PerGroup, decay_lr_rate: float = 0.0,
                 cycle_first_step_size: float = 2000, cycle_second_step_size: float | None = None,
                 cycle_first_stair_count: int = 0, cycle_second_stair_count: int | None = None,
                 decay_step_size: float = 0, cycle_momentum: bool = True, cycle_min_mom: PerGroup = 0.8,
                 cycle_max_mom: PerGroup = 0.9, decay_mom_rate: float = 0.0, last_batch_iteration: int = -1) -> None:
        super().__init__(optimizer, last_batch_iteration)
        self._shape(cycle_first_step_size, cycle_second_step_size, cycle_first_stair_count,
                    cycle_second_stair_count, decay_step_size)
        self.min_lrs = per_group(self.optimizer, cycle_min_lr, "cycle_min_lr")
        self.max_lrs = per_group(self.optimizer, cycle_max_lr, "cycle_max_lr")
        self.decay_lr_rate = decay_lr_rate
        self.skip_lr_decay = self.skip_lr_decay or math.isclose(decay_lr_rate, 0)
        starting = last_batch_iteration == -1
        if starting:
            write_lrs(self.optimizer, self.min_lrs)
        self.cycle_momentum = cycle_momentum and self._has_betas()
        if self.cycle_momentum:
            self.decay_mom_rate = decay_mom_rate
            self.min_moms = [(m, BETA2) for m in per_group(self.optimizer, cycle_min_mom, "cycle_min_mom")]
            self.max_moms = [(m, BETA2) for m in per_group(self.optimizer, cycle_max_mom, "cycle_max_mom")]
            self.skip_mom_decay = self.skip_mom_decay or math.isclose(decay_mom_rate, 0)
            if starting:
                self._write_betas(self.min_moms)

    def _shape(self, first: float, second: float | None, first_stairs: int, second_stairs: int | None,
               decay_step_size: float) -> None:
        first = float(first)
        second = first if second is None else float(second)
        # a zero first half would divide by step_ratio 0; a zero second half is a valid saw-tooth
        if first <= 0:
            raise ScheduleError(f"cycle_first_step_size must be positive, got {first}",
                                "set scheduler.params.cycle_first_step_size to the steps of the rising half")
        if second < 0:
            raise ScheduleError(f"cycle_second_step_size must be non-negative, got {second}",
                                "set scheduler.params.cycle_second_step_size, or leave it out (= the first)")
        self.total_size = first + second
        self.step_ratio = first / self.total_size
        self.first_step_size, self.second_step_size = first, second
        self.first_stair_count = first_stairs
        self.second_stair_count = first_stairs if second_stairs is None else second_stairs
        self.decay_step_size = decay_step_size
        self.skip_lr_decay = self.skip_mom_decay = math.isclose(decay_step_size, 0)

    def _has_betas(self) -> bool:
        if "betas" in self.optimizer.defaults:
            return True
        warnings.warn(f"OneCycle: cycle_momentum is off because {type(self.optimizer).__name__} has no betas",
                      stacklevel=3)
        return False

    def _write_betas(self, betas: list[tuple[float, float]]) -> None:
        for group, pair in zip(self.optimizer.param_groups, betas, strict=False):
            group["betas"] = pair

    def _scale(self) -> float:
        """Where in the cycle the counter is: 0 at the bottom, 1 at the peak (floored to a stair if asked)."""
        position = self.last_batch_iteration + 1
        x = 1.0 + position / self.total_size - math.floor(1 + position / self.total_size)
        if x <= self.step_ratio:
            scale, stairs = x / self.step_ratio, self.first_stair_count
        else:
            scale, stairs = (x - 1) / (self.step_ratio - 1), self.second_stair_count
        if stairs > 0:  # from the integer offset: the float scale may sit a hair under an exact stair
            into = position % self.total_size
            if into <= self.first_step_size:
                stair = into * stairs / self.first_step_size
            else:
                stair = (self.total_size - into) * stairs / self.second_step_size
            scale = math.floor(stair) / stairs
        return scale

    def _decay_interval(self) -> float:
        return (self.last_batch_iteration - self.total_size + 1) / self.decay_step_size

    def get_lr(self) -> list[float]:
        if self.last_batch_iteration < self.total_size:
            scale = self._scale()
            return [low + (high - low) * scale for low, high in zip(self.min_lrs, self.max_lrs, strict=True)]
        if self.skip_lr_decay:
            return list(self.min_lrs)
        factor = 1 + self.decay_lr_rate * self._decay_interval()
        return [low / factor for low in self.min_lrs]

    def get_mom(self) -> list[tuple[float, float]] | None:
        """Each group's ``betas`` at the counter; None without momentum cycling."""
        if not self.cycle_momentum:
            return None
        if self.last_batch_iteration < self.total_size:
            scale = self._scale()
            return [(high - (high - low) * scale, low2)
                    for (low, low2), (high, _) in zip(self.min_moms, self.max_moms, strict=True)]
        if self.skip_mom_decay:
            return list(self.max_moms)
        factor = 1 + self.decay_mom_rate * self._decay_interval()
        return [(beta1 * factor, beta2) for beta1, beta2 in self.max_moms]

    def _apply(self) -> None:
        super()._apply()
        moms = self.get_mom()
        if moms is not None:
            self._write_betas(moms)
