"""``deepspeed.runtime``."""

from . import config, utils, zero  # noqa: F401
