"""``deepspeed.runtime.lr_schedules``: DeepSpeed's scheduler classes and the names of their parameters.

The classes are the engine's own (:mod:`zerorun.engine.training.schedulers`): DeepSpeed's
constructor arguments, attributes (``min_lrs``, ``warmup_num_steps``, ``step_ratio`` ...),
``get_lr``/``get_last_lr``/``get_mom``/``get_lr_ratio``, and its values at every step, which
are also what a config's ``scheduler`` block gets.
"""

from __future__ import annotations

from zerorun.engine.training.schedulers import LRRangeTest, OneCycle, WarmupCosineLR, WarmupDecayLR, WarmupLR

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


__all__ = ["COS_MIN_RATIO", "CYCLE_FIRST_STAIR_COUNT", "CYCLE_FIRST_STEP_SIZE", "CYCLE_MAX_LR",
           "CYCLE_MAX_MOM", "CYCLE_MIN_LR", "CYCLE_MIN_MOM", "CYCLE_SECOND_STAIR_COUNT",
           "CYCLE_SECOND_STEP_SIZE", "DECAY_LR_RATE", "DECAY_MOM_RATE", "DECAY_STEP_SIZE", "EDGE_VALUE",
           "LRRangeTest", "LR_RANGE_TEST", "LR_RANGE_TEST_MIN_LR", "LR_RANGE_TEST_STAIRCASE",
           "LR_RANGE_TEST_STEP_RATE", "LR_RANGE_TEST_STEP_SIZE", "LR_SCHEDULE", "MID_VALUE", "ONE_CYCLE",
           "OneCycle", "TOTAL_NUM_STEPS", "VALID_LR_SCHEDULES", "WARMUP_COSINE_LR", "WARMUP_DECAY_LR",
           "WARMUP_LINEAR_RATE", "WARMUP_LOG_RATE", "WARMUP_LR", "WARMUP_MAX_LR", "WARMUP_MIN_LR",
           "WARMUP_MIN_RATIO", "WARMUP_NUM_STEPS", "WARMUP_TYPE", "WarmupCosineLR", "WarmupDecayLR",
           "WarmupLR"]
