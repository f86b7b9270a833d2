"""``deepspeed.runtime.zero``: ``Init`` and ``MiCS_Init`` (zerorun.compat.zero_init), ``GatheredParameters`` (zerorun.zero),
``unwrap_model_for_generation`` (zerorun.compat.generation), ``ZeroParamStatus`` (a stage-3 parameter's
``ds_status``, zerorun.compat.params), ``TiledLinear`` (zerorun.compat.tiling), as DeepSpeed exports them here."""

from zerorun.compat.generation import unwrap_model_for_generation  # noqa: F401
from zerorun.compat.params import ZeroParamStatus  # noqa: F401
from zerorun.compat.tiling import TiledLinear, TiledLinearReturnBias  # noqa: F401
from zerorun.compat.zero_init import Init, MiCS_Init, register_external_parameter  # noqa: F401
from zerorun.zero import GatheredParameters  # noqa: F401

from . import partition_parameters  # noqa: F401,E402
