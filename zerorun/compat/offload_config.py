"""``deepspeed.runtime.zero.offload_config``: DeepSpeed's offload enums and config classes.

``OffloadDeviceEnum`` names where offloaded state lives; ``OffloadStateTypeEnum`` names
the state ``engine.offload_states(include=...)`` moves (see :mod:`zerorun.engine.surface.offload_states`).
The config classes are zerorun's own offload blocks under DeepSpeed's names.
"""

from __future__ import annotations

from zerorun.config.schema_zero import OffloadOptimizerConfig, OffloadParamConfig
from zerorun.engine.surface.offload_states import OffloadDeviceEnum, OffloadStateTypeEnum

DeepSpeedZeroOffloadParamConfig = OffloadParamConfig
DeepSpeedZeroOffloadOptimizerConfig = OffloadOptimizerConfig

__all__ = ["DeepSpeedZeroOffloadOptimizerConfig", "DeepSpeedZeroOffloadParamConfig", "OffloadDeviceEnum",
           "OffloadStateTypeEnum"]
