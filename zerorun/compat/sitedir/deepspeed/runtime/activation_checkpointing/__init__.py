"""``deepspeed.runtime.activation_checkpointing``: its ``checkpointing`` module is :mod:`zerorun.compat.checkpointing`."""

from . import checkpointing  # noqa: F401
