"""``deepspeed.runtime.constants``: DeepSpeed's names for the top-level config keys, with zerorun's defaults.

The defaults are read from zerorun's schema (the values the engine applies), so they
cannot drift from what a run does; DeepSpeed 0.19.8 has the same ones (a test checks).
"""

from __future__ import annotations

from typing import Any

from zerorun.config.schema import ZerorunConfig

_FIELDS = ZerorunConfig.model_fields

TRAIN_BATCH_SIZE = "train_batch_size"
TRAIN_MICRO_BATCH_SIZE_PER_GPU = "train_micro_batch_size_per_gpu"
GRADIENT_ACCUMULATION_STEPS = "gradient_accumulation_steps"
GRADIENT_CLIPPING = "gradient_clipping"
GRADIENT_CLIPPING_DEFAULT: float = _FIELDS[GRADIENT_CLIPPING].default
STEPS_PER_PRINT = "steps_per_print"
STEPS_PER_PRINT_DEFAULT: int = _FIELDS[STEPS_PER_PRINT].default
PRESCALE_GRADIENTS = "prescale_gradients"
PRESCALE_GRADIENTS_DEFAULT: bool = _FIELDS[PRESCALE_GRADIENTS].default
GRADIENT_PREDIVIDE_FACTOR = "gradient_predivide_factor"
GRADIENT_PREDIVIDE_FACTOR_DEFAULT: float = _FIELDS[GRADIENT_PREDIVIDE_FACTOR].default
WALL_CLOCK_BREAKDOWN = "wall_clock_breakdown"
WALL_CLOCK_BREAKDOWN_DEFAULT: bool = _FIELDS[WALL_CLOCK_BREAKDOWN].default


def get_gradient_clipping(param_dict: dict[str, Any]) -> float:
    """``deepspeed.runtime.config.get_gradient_clipping``: the key's value, else the default (1.0)."""
    return param_dict.get(GRADIENT_CLIPPING, GRADIENT_CLIPPING_DEFAULT)


__all__ = [n for n in dir() if n.isupper() and not n.startswith("_")] + ["get_gradient_clipping"]
