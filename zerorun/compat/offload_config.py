"""``deepspeed.runtime.zero.offload_config``: DeepSpeed's offload enums and config classes.

``OffloadDeviceEnum`` names where offloaded state lives; ``OffloadStateTypeEnum`` names
the state ``engine.offload_states(include=...)`` moves (see :mod:`zerorun.engine.offload_states`).
The config classes are zerorun's own offload blocks under DeepSpeed's names.
"""

from __future__ import annotations

from enum import Enum

from zerorun.config.schema_zero import OffloadOptimizerConfig, OffloadParamConfig


class OffloadDeviceEnum(str, Enum):
    """Valid offload devices (DeepSpeed's values)."""

    none = "none"
    cpu = "cpu"
    nvme = "nvme"


class OffloadStateTypeEnum(str, Enum):
    """The state ``offload_states`` can move (DeepSpeed's values)."""

    optim_states = "optim_states"
    hp_params = "hp_params"
    lp_params = "lp_params"
    lp_grads = "lp_grads"
    contiguous_grad_buffer = "contiguous_grad_buffer"


DeepSpeedZeroOffloadParamConfig = OffloadParamConfig
DeepSpeedZeroOffloadOptimizerConfig = OffloadOptimizerConfig

__all__ = ["DeepSpeedZeroOffloadOptimizerConfig", "DeepSpeedZeroOffloadParamConfig", "OffloadDeviceEnum",
           "OffloadStateTypeEnum"]
