"""``deepspeed.runtime.lr_schedules``: DeepSpeed's scheduler classes over zerorun's schedules.

``WarmupLR(optimizer, warmup_min_lr, ...)`` and friends take DeepSpeed's constructor
arguments and step exactly as zerorun's engine steps its configured schedules (the
counter starts at -1, see :mod:`zerorun.engine.training.schedulers`).
"""

from __future__ import annotations

from typing import Any

import torch

from zerorun.engine.training import schedulers as sched

WARMUP_LOG_RATE = "log"
WARMUP_LINEAR_RATE = "linear"
LR_RANGE_TEST, ONE_CYCLE, WARMUP_LR, WARMUP_DECAY_LR, WARMUP_COSINE_LR = (
    "LRRangeTest", "OneCycle", "WarmupLR", "WarmupDecayLR", "WarmupCosineLR")
VALID_LR_SCHEDULES = [LR_RANGE_TEST, ONE_CYCLE, WARMUP_LR, WARMUP_DECAY_LR, WARMUP_COSINE_LR]
# DeepSpeed's names for the schedules' parameter keys (scripts and tests build `scheduler.params` with them)
LR_SCHEDULE = "lr_schedule"
LR_RANGE_TEST_MIN_LR, LR_RANGE_TEST_STEP_RATE = "lr_range_test_min_lr", "lr_range_test_step_rate"
LR_RANGE_TEST_STEP_SIZE, LR_RANGE_TEST_STAIRCASE = "lr_range_test_step_size", "lr_range_test_staircase"
EDGE_VALUE, MID_VALUE = "edge_value", "mid_value"
CYCLE_FIRST_STEP_SIZE, CYCLE_FIRST_STAIR_COUNT = "cycle_first_step_size", "cycle_first_stair_count"
CYCLE_SECOND_STEP_SIZE, CYCLE_SECOND_STAIR_COUNT = "cycle_second_step_size", "cycle_second_stair_count"
DECAY_STEP_SIZE = "decay_step_size"
CYCLE_MIN_LR, CYCLE_MAX_LR, DECAY_LR_RATE = "cycle_min_lr", "cycle_max_lr", "decay_lr_rate"
CYCLE_MIN_MOM, CYCLE_MAX_MOM, DECAY_MOM_RATE = "cycle_min_mom", "cycle_max_mom", "decay_mom_rate"
WARMUP_MIN_LR, WARMUP_MAX_LR, WARMUP_NUM_STEPS, WARMUP_TYPE = (
    "warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type")
WARMUP_MIN_RATIO, COS_MIN_RATIO, TOTAL_NUM_STEPS = "warmup_min_ratio", "cos_min_ratio", "total_num_steps"


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


class OneCycle(_Scheduler):
    def __init__(self, optimizer: torch.optim.Optimizer, cycle_min_lr: float, cycle_max_lr: float,
                 decay_lr_rate: float = 0.0, cycle_first_step_size: int = 2000,
                 cycle_second_step_size: int | None = None, cycle_first_stair_count: int = 0,
                 cycle_second_stair_count: int | None = None, decay_step_size: int = 0,
                 cycle_momentum: bool = True, cycle_min_mom: float = 0.8, cycle_max_mom: float = 0.9,
                 decay_mom_rate: float = 0.0, last_batch_iteration: int = -1) -> None:
        schedule = sched.OneCycle(cycle_min_lr, cycle_max_lr, decay_lr_rate, cycle_first_step_size,
                                  cycle_second_step_size, cycle_first_stair_count, cycle_second_stair_count,
                                  decay_step_size, cycle_momentum, cycle_min_mom, cycle_max_mom, decay_mom_rate)
        super().__init__(optimizer, schedule, last_batch_iteration)


class LRRangeTest(_Scheduler):
    def __init__(self, optimizer: torch.optim.Optimizer, lr_range_test_min_lr: float = 1e-3,
                 lr_range_test_step_size: int = 2000, lr_range_test_step_rate: float = 1.0,
                 lr_range_test_staircase: bool = False, last_batch_iteration: int = -1) -> None:
        schedule = sched.LRRangeTest(lr_range_test_min_lr, lr_range_test_step_size, lr_range_test_step_rate,
                                     lr_range_test_staircase)
        super().__init__(optimizer, schedule, last_batch_iteration)

__all__ = ["COS_MIN_RATIO", "CYCLE_FIRST_STAIR_COUNT", "CYCLE_FIRST_STEP_SIZE", "CYCLE_MAX_LR",
           "CYCLE_MAX_MOM", "CYCLE_MIN_LR", "CYCLE_MIN_MOM", "CYCLE_SECOND_STAIR_COUNT",
           "CYCLE_SECOND_STEP_SIZE", "DECAY_LR_RATE", "DECAY_MOM_RATE", "DECAY_STEP_SIZE", "EDGE_VALUE",
           "LRRangeTest", "LR_RANGE_TEST", "LR_RANGE_TEST_MIN_LR", "LR_RANGE_TEST_STAIRCASE",
           "LR_RANGE_TEST_STEP_RATE", "LR_RANGE_TEST_STEP_SIZE", "LR_SCHEDULE", "MID_VALUE", "ONE_CYCLE",
           "OneCycle", "TOTAL_NUM_STEPS", "VALID_LR_SCHEDULES", "WARMUP_COSINE_LR", "WARMUP_DECAY_LR",
           "WARMUP_LINEAR_RATE", "WARMUP_LOG_RATE", "WARMUP_LR", "WARMUP_MAX_LR", "WARMUP_MIN_LR",
           "WARMUP_MIN_RATIO", "WARMUP_NUM_STEPS", "WARMUP_TYPE", "WarmupCosineLR", "WarmupDecayLR",
           "WarmupLR"]
