"""``deepspeed.runtime.zero.partition_parameters``: ``ZeroParamStatus``, ``is_zero_param`` and a parameter's status;
``partitioned_param_data_shape`` (a partitioned parameter's shape at rest) and ``MultipleAllGatherHandles``.

The per-parameter attributes themselves (``p.ds_status``, ``p.ds_numel``, ...) are kept by
:mod:`zerorun.engine.surface.ds_param_attrs`.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

from zerorun.engine.mechanism.partition import bucket_of
from zerorun.engine.surface.ds_param_attrs import ZeroParamStatus, is_zero_param, status_of

partitioned_param_data_shape = [0]
"""The shape of a partitioned parameter at rest (its ``.data`` is an empty placeholder, as in DeepSpeed)."""


class _Waitable(Protocol):
    def wait(self, *args: Any, **kwargs: Any) -> Any: ...


class MultipleAllGatherHandles:
    """Several all-gather handles waited for as one (``wait(handle_dependency=...)`` passed to each by keyword)."""

    def __init__(self, handles: list[_Waitable]) -> None:
        self.handles = handles

    def wait(self, handle_dependency: bool = True) -> None:
        for handle in self.handles:
            handle.wait(handle_dependency=handle_dependency)


def param_status(param: torch.Tensor) -> ZeroParamStatus:
    """The :class:`ZeroParamStatus` of ``param`` (``AVAILABLE`` for parameters that are not partitioned)."""
    bucket = bucket_of(param)
    return ZeroParamStatus.AVAILABLE if bucket is None else status_of(bucket)


__all__ = ["MultipleAllGatherHandles", "ZeroParamStatus", "is_zero_param", "param_status",
           "partitioned_param_data_shape"]
