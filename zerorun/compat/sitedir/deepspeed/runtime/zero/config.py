"""``deepspeed.runtime.zero.config`` -> :mod:`zerorun.compat.config_models`."""

from zerorun.compat.config_models import (  # noqa: F401
    DeepSpeedZeroConfig,
    DeepSpeedZeroOffloadOptimizerConfig,
    DeepSpeedZeroOffloadParamConfig,
)
from zerorun.compat.offload_config import OffloadDeviceEnum, OffloadStateTypeEnum  # noqa: F401
