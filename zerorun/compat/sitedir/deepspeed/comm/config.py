"""``deepspeed.comm.config`` -> :mod:`zerorun.compat.comm_config`."""

from zerorun.compat.comm_config import *  # noqa: F403
