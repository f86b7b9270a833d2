"""``deepspeed.runtime.zero.linear`` -> :mod:`zerorun.compat.linear`."""

from zerorun.compat.linear import *  # noqa: F403
