"""``deepspeed.runtime``."""

from . import config, lr_schedules, utils, zero  # noqa: F401
