"""``deepspeed.runtime.dataloader``: ``RepeatingLoader`` (:mod:`zerorun.compat.runtime_utils`)."""

from zerorun.compat.runtime_utils import RepeatingLoader  # noqa: F401
