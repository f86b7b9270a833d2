"""``deepspeed.utils`` -> :mod:`zerorun.compat.utils`."""

from zerorun.compat.utils import *  # noqa: F403
