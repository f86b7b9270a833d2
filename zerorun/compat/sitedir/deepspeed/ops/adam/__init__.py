"""``deepspeed.ops.adam`` -> :mod:`zerorun.compat.optimizers`."""

from zerorun.compat.optimizers import DeepSpeedCPUAdam, FusedAdam  # noqa: F401
