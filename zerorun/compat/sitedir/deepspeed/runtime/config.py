"""``deepspeed.runtime.config`` -> :mod:`zerorun.compat.config`."""

from zerorun.compat.config import *  # noqa: F403
