"""``deepspeed.runtime.zero``: ``Init`` and ``MiCS_Init`` (zerorun.compat.zero_init), ``GatheredParameters`` (zerorun.zero)."""

from zerorun.compat.zero_init import Init, MiCS_Init, register_external_parameter  # noqa: F401
from zerorun.zero import GatheredParameters  # noqa: F401

from . import partition_parameters  # noqa: F401,E402
