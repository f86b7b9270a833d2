"""``deepspeed.runtime.zero``: ``Init`` and ``MiCS_Init`` (zerorun.compat.zero_init), ``GatheredParameters`` (zerorun.zero),
``unwrap_model_for_generation`` (zerorun.compat.generation)."""

from zerorun.compat.generation import unwrap_model_for_generation  # noqa: F401
from zerorun.compat.zero_init import Init, MiCS_Init, register_external_parameter  # noqa: F401
from zerorun.zero import GatheredParameters  # noqa: F401

from . import partition_parameters  # noqa: F401,E402
