"""``deepspeed.runtime.activation_checkpointing.checkpointing`` -> :mod:`zerorun.compat.checkpointing`."""

from zerorun.compat.checkpointing import *  # noqa: F403
