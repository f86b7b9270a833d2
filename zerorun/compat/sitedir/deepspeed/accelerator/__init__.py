"""``deepspeed.accelerator`` -> :mod:`zerorun.compat.accelerator`."""

from zerorun.compat.accelerator import *  # noqa: F403
