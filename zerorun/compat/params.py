"""``deepspeed.runtime.zero.partition_parameters``: ``ZeroParamStatus`` and the status of a parameter."""

from __future__ import annotations

from enum import Enum

import torch

from zerorun.engine.param_state import ParamState
from zerorun.engine.partition import bucket_of


class ZeroParamStatus(Enum):
    """DeepSpeed's names (and values) for a stage-3 parameter's state."""

    AVAILABLE = 1  # the full parameter is present (gathered, or never partitioned)
    NOT_AVAILABLE = 2  # only this rank's shard is held
    INFLIGHT = 3  # its all-gather is running


_FROM_STATE = {ParamState.GATHERED: ZeroParamStatus.AVAILABLE, ParamState.SHARDED: ZeroParamStatus.NOT_AVAILABLE,
               ParamState.IN_FLIGHT: ZeroParamStatus.INFLIGHT}


def param_status(param: torch.Tensor) -> ZeroParamStatus:
    """The :class:`ZeroParamStatus` of ``param`` (``AVAILABLE`` for parameters that are not partitioned)."""
    bucket = bucket_of(param)
    if bucket is None or bucket.persistent:
        return ZeroParamStatus.AVAILABLE
    return _FROM_STATE[bucket.state]


__all__ = ["ZeroParamStatus", "param_status"]
