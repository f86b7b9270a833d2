"""``deepspeed.comm`` -> :mod:`zerorun.compat.comm`."""

from zerorun.compat.comm import *  # noqa: F403
