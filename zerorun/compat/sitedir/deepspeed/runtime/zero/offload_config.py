"""``deepspeed.runtime.zero.offload_config`` -> :mod:`zerorun.compat.offload_config`."""

from zerorun.compat.offload_config import *  # noqa: F403
