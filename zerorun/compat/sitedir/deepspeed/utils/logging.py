"""``deepspeed.utils.logging`` -> :mod:`zerorun.compat.utils` (DeepSpeed's logger and ``log_dist``)."""

from zerorun.compat.utils import (  # noqa: F401
    get_log_level_from_string,
    log_dist,
    logger,
    set_log_level_from_string,
)
