"""The tensor-constructor hooks of DeepSpeed's ``zero.Init``, as names integrations patch.

DeepSpeed's ``zero.Init`` replaces ``torch.empty``/``zeros``/``arange``... with wrappers
built by ``zero_wrapper_for_fp_tensor_constructor`` (they cast floating-point results to
the init dtype) and keeps the originals as ``_orig_torch_*``. transformers swaps that
wrapper around ``zero.Init`` (``prevent_arange_dtype_change``) so RoPE buffers keep their
dtype. zerorun's ``zero.Init`` wraps no constructor - it shards each module right after
its constructor - so nothing here is called during an init; the names exist so such a
patch finds them, and behave as DeepSpeed's if someone does call them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

_orig_torch_empty = torch.empty
_orig_torch_zeros = torch.zeros
_orig_torch_ones = torch.ones
_orig_torch_full = torch.full
_orig_torch_arange = torch.arange


def zero_wrapper_for_fp_tensor_constructor(fn: Callable[..., torch.Tensor], target_fp_dtype: torch.dtype,
                                           target_device: Any = None) -> Callable[..., torch.Tensor]:
    """``fn`` whose floating-point results are cast to ``target_fp_dtype`` (and built on ``target_device``)."""

    def wrapped(*args: Any, **kwargs: Any) -> torch.Tensor:
        if kwargs.get("device") is None and target_device is not None:
            kwargs["device"] = target_device
        tensor = fn(*args, **kwargs)
        return tensor.to(target_fp_dtype) if tensor.is_floating_point() else tensor

    return wrapped


__all__ = ["zero_wrapper_for_fp_tensor_constructor"]
