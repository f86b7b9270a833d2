"""What every learning-rate schedule shares: the step counter, per-group values, writing the optimizer's lrs.

DeepSpeed 0.19.8's contract, which scripts and checkpoints rely on: the counter
``last_batch_iteration`` starts at -1 and ``step()`` advances it once per applied optimizer
step; ``get_lr()`` is the schedule's formula at the counter; a scheduler built with
``last_batch_iteration=-1`` writes its starting lrs into the optimizer, one built to resume
(any other value) leaves them until its next ``step()``; ``state_dict()`` holds the counter
alone. An lr that is a tensor (a captured or compiled optimizer's) is filled in place, so
whoever holds that tensor sees the new value.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from typing import Any, TypeAlias

import torch

from zerorun.engine.errors import EngineError

LOG, LINEAR = "log", "linear"

Value: TypeAlias = float | torch.Tensor
"""A learning rate or momentum: a number, or a one-element tensor (a captured optimizer's lr)."""
PerGroup: TypeAlias = Value | Sequence[Value]
"""One value for every parameter group, or one per group (DeepSpeed's schedules take both)."""


class ScheduleError(EngineError, ValueError):
    """A schedule parameter DeepSpeed rejects too (it raises ``ValueError``, so this is one)."""


def torch_optimizer(optimizer: object) -> torch.optim.Optimizer:
    """The ``torch.optim.Optimizer`` to schedule: ``optimizer`` itself, or the one a wrapper holds as ``.optimizer``."""
    if isinstance(optimizer, torch.optim.Optimizer):
        return optimizer
    inner = getattr(optimizer, "optimizer", None)
    if isinstance(inner, torch.optim.Optimizer):
        return inner
    raise TypeError(f"{type(optimizer).__name__} is not a subclass of torch.optim.Optimizer")


def as_number(value: Value) -> float:
    """A one-element tensor as a Python float (an lr may be a tensor); anything else unchanged."""
    return float(value) if torch.is_tensor(value) else value  # type: ignore[return-value]


def per_group(optimizer: torch.optim.Optimizer, value: PerGroup, name: str) -> list[float]:
    """One value per parameter group: a scalar for every group, or a list/tuple with one entry per group."""
    groups = len(optimizer.param_groups)
    if isinstance(value, (list, tuple)):
        if len(value) != groups:
            raise ScheduleError(f"expected {groups} value for {name}, got {len(value)} (one per parameter group)",
                                f"give {name} one number, or a list of {groups}")
        return [as_number(v) for v in value]
    return [as_number(value)] * groups


def check_positive_int(value: object, name: str) -> None:
    """DeepSpeed's check on a step count: a positive ``int`` (``None``, 0, negatives and floats are refused)."""
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ScheduleError(f"{name} must be a positive integer, got {value}",
                            f"set scheduler.params.{name} to a step count such as 1000")


def warmup_type_or_log(warmup_type: str) -> str:
    """``log`` or ``linear``; anything else warns and is ``log``, as DeepSpeed does."""
    if warmup_type in (LOG, LINEAR):
        return warmup_type
    warnings.warn(f"scheduler warmup_type {warmup_type!r} is unknown: using 'log' (valid: 'log', 'linear')",
                  stacklevel=3)
    return LOG


def warmup_fraction(step: int, steps: int, warmup_type: str) -> float:
    """Fraction of the warm-up done at counter ``step`` < ``steps``, with DeepSpeed's arithmetic (bit for bit)."""
    if warmup_type == LOG:
        return 1.0 / math.log(steps) * math.log(step + 1)
    return step / steps


def write_lrs(optimizer: torch.optim.Optimizer, lrs: Sequence[Value]) -> list[Value]:
    """Each group's lr set to its value (a tensor lr filled in place); the groups' lrs as they now are."""
    for group, lr in zip(optimizer.param_groups, lrs, strict=False):
        if torch.is_tensor(group["lr"]):
            group["lr"].fill_(lr.squeeze() if torch.is_tensor(lr) else lr)
        else:
            group["lr"] = lr
    return [group["lr"] for group in optimizer.param_groups]


class Scheduler:
    """The stateful part of a schedule; a subclass gives ``get_lr()`` (and may cycle ``betas``)."""

    def __init__(self, optimizer: object, last_batch_iteration: int = -1) -> None:
        self.optimizer = torch_optimizer(optimizer)
        self.last_batch_iteration = last_batch_iteration
        self._last_lr: list[Value] | None = None

    def _start(self) -> None:
        """Write the starting values, for a scheduler that starts rather than resumes."""
        if self.last_batch_iteration == -1:
            self._last_lr = write_lrs(self.optimizer, self.get_lr())

    def get_lr(self) -> list[float]:
        raise NotImplementedError

    def _apply(self) -> None:
        self._last_lr = write_lrs(self.optimizer, self.get_lr())

    def step(self, last_batch_iteration: int | None = None) -> None:
        """Advance the counter (or set it) and write the lrs the next optimizer step uses."""
        self.last_batch_iteration = (self.last_batch_iteration + 1 if last_batch_iteration is None
                                     else last_batch_iteration)
        self._apply()

    def get_last_lr(self) -> list[Value]:
        """The lrs last written into the optimizer."""
        assert self._last_lr is not None, "need to call step() first"
        return self._last_lr

    def state_dict(self) -> dict[str, int]:
        return {"last_batch_iteration": self.last_batch_iteration}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a saved counter; the optimizer gets that step's lrs now (a checkpoint's optimizer
        state holds the same values, so resuming reads the same lr either way)."""
        self.last_batch_iteration = state["last_batch_iteration"]
        self._apply()
