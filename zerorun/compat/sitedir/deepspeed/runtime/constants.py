"""``deepspeed.runtime.constants``: DeepSpeed's top-level config key names and the defaults zerorun applies."""

from zerorun.compat.config_keys import *  # noqa: F403
