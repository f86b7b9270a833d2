"""``deepspeed.moe.utils`` -> :mod:`zerorun.compat.moe` (answers for models without experts)."""

from zerorun.compat.moe import *  # noqa: F403
