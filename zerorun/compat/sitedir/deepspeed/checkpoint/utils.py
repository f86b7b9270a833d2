"""``deepspeed.checkpoint.utils`` -> :mod:`zerorun.compat.checkpoint_utils`."""

from zerorun.compat.checkpoint_utils import *  # noqa: F403
