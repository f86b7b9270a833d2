"""``deepspeed.accelerator.get_accelerator()``: the device API DeepSpeed scripts call.

Two implementations behind one interface: CUDA (``torch.cuda``) and CPU (ranks on gloo,
memory figures from psutil, as DeepSpeed's CPU accelerator reports them). The choice is
``DS_ACCELERATOR`` (``cuda``/``cpu``) if set, else CUDA when it is available. Device
names, ``communication_backend_name()`` and the dtype answers are DeepSpeed's.
"""

from __future__ import annotations

import functools
import os
from typing import Any

import torch

from zerorun.compat.accelerator_base import Accelerator
from zerorun.compat.accelerator_cpu import CpuAccelerator
from zerorun.compat.accelerator_cuda import CudaAccelerator
from zerorun.errors import unsupported

_KINDS = {"cuda": CudaAccelerator, "cpu": CpuAccelerator}


@functools.cache
def _accelerator(kind: str) -> Accelerator:
    return _KINDS[kind]()


def get_accelerator() -> Accelerator:
    """This process's accelerator: ``DS_ACCELERATOR`` if set, else CUDA if available, else CPU."""
    kind = os.environ.get("DS_ACCELERATOR", "").strip().lower()
    if kind and kind not in _KINDS:
        unsupported(f"accelerator {kind!r} (DS_ACCELERATOR)", "set DS_ACCELERATOR to cuda or cpu, or unset it")
    return _accelerator(kind or ("cuda" if torch.cuda.is_available() else "cpu"))


def set_accelerator(accel_obj: Any) -> None:
    unsupported("custom accelerators (deepspeed.accelerator.set_accelerator)")


def is_current_accelerator_supported() -> bool:
    return True


__all__ = ["Accelerator", "CpuAccelerator", "CudaAccelerator", "get_accelerator", "is_current_accelerator_supported",
           "set_accelerator"]
