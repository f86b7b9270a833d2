"""``deepspeed.runtime.base_optimizer`` -> :mod:`zerorun.compat.base_optimizer`; its other names are stand-ins
that raise UnsupportedFeature on use."""

from zerorun.compat.base_optimizer import DeepSpeedOptimizer, ZeROOptimizer  # noqa: F401
from zerorun.compat.lazy import unsupported_names

__getattr__ = unsupported_names("deepspeed.runtime.base_optimizer")
