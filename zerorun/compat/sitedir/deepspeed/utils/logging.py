"""``deepspeed.utils.logging`` -> :mod:`zerorun.compat.utils` (DeepSpeed's logger and ``log_dist``)."""

from zerorun.compat.utils import log_dist, logger  # noqa: F401
