"""``deepspeed.runtime.utils`` -> :mod:`zerorun.compat.runtime_utils`."""

from zerorun.compat.runtime_utils import *  # noqa: F403
