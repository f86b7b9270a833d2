"""``deepspeed.runtime.base_optimizer``: ``ZeROOptimizer`` and ``DeepSpeedOptimizer`` as ``isinstance`` targets.

An engine at ZeRO stages 1-3 steps the script's own optimizer, which answers ``isinstance(opt,
ZeROOptimizer)`` (and ``DeepSpeedOptimizer``, its base) as DeepSpeed's ZeRO optimizers do
(:mod:`zerorun.engine.surface.zero_optimizer`). Neither class can be constructed.
"""

from __future__ import annotations

from typing import Any

from zerorun.engine.surface.zero_optimizer import ZERO_OPTIMIZERS
from zerorun.errors import unsupported

__all__ = ["DeepSpeedOptimizer", "ZeROOptimizer"]


class _EngineOptimizers(type):
    def __instancecheck__(cls, obj: Any) -> bool:
        try:
            return obj in ZERO_OPTIMIZERS
        except TypeError:  # not weakly referenceable: not an engine's optimizer
            return False


class DeepSpeedOptimizer(metaclass=_EngineOptimizers):
    """DeepSpeed's optimizer base: an engine's ZeRO optimizer is an instance; none is constructed."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        unsupported("runtime.base_optimizer.DeepSpeedOptimizer (construction)")


class ZeROOptimizer(DeepSpeedOptimizer):
    """DeepSpeed's ZeRO optimizer base: the optimizer of an engine at stages 1-3 is an instance."""
