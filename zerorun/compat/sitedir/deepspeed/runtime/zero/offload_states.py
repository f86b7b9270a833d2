"""``deepspeed.runtime.zero.offload_states`` -> :mod:`zerorun.compat.offload_states`."""

from zerorun.compat.offload_states import *  # noqa: F403
