"""``deepspeed.checkpointing`` -> :mod:`zerorun.compat.checkpointing`."""

from zerorun.compat.checkpointing import *  # noqa: F403
