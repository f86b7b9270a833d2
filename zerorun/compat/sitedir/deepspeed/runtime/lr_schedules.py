"""``deepspeed.runtime.lr_schedules`` -> :mod:`zerorun.compat.lr_schedules`."""

from zerorun.compat.lr_schedules import *  # noqa: F403
