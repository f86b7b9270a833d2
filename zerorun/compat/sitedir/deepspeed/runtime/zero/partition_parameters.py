"""``deepspeed.runtime.zero.partition_parameters`` -> :mod:`zerorun.compat.params`."""

from zerorun.compat.params import *  # noqa: F403
from zerorun.compat.zero_init import Init, register_external_parameter  # noqa: F401
from zerorun.zero import GatheredParameters  # noqa: F401
