"""``deepspeed.runtime.precision_config`` -> :mod:`zerorun.compat.precision_config`."""

from zerorun.compat.precision_config import *  # noqa: F403
