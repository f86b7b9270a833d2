"""``deepspeed.runtime.swap_tensor`` -> :mod:`zerorun.compat.swap_tensor`."""

from zerorun.compat.swap_tensor import *  # noqa: F403
