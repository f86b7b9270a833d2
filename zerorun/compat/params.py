"""``deepspeed.runtime.zero.partition_parameters``: ``ZeroParamStatus``, ``is_zero_param`` and a parameter's status.

The per-parameter attributes themselves (``p.ds_status``, ``p.ds_numel``, ...) are kept by
:mod:`zerorun.engine.surface.ds_param_attrs`.
"""

from __future__ import annotations

import torch

from zerorun.engine.mechanism.partition import bucket_of
from zerorun.engine.surface.ds_param_attrs import ZeroParamStatus, is_zero_param, status_of


def param_status(param: torch.Tensor) -> ZeroParamStatus:
    """The :class:`ZeroParamStatus` of ``param`` (``AVAILABLE`` for parameters that are not partitioned)."""
    bucket = bucket_of(param)
    return ZeroParamStatus.AVAILABLE if bucket is None else status_of(bucket)


__all__ = ["ZeroParamStatus", "is_zero_param", "param_status"]
