"""``deepspeed.runtime.zero.partition_parameters`` -> :mod:`zerorun.compat.params`."""

from zerorun.compat.params import *  # noqa: F403
from zerorun.zero import GatheredParameters, Init  # noqa: F401
