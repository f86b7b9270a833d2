"""``deepspeed.utils.torch``: DeepSpeed's torch-version test and its torch.func probe, which scripts and
DeepSpeed's own tests import."""

from __future__ import annotations

import torch
from torch.torch_version import TorchVersion

from zerorun import torch_compat

__all__ = ["is_functorch_transforming", "required_torch_version"]


def required_torch_version(min_version: float | str | None = None, max_version: float | str | None = None) -> bool:
    """Whether the installed torch is at least ``min_version`` and at most ``max_version`` (DeepSpeed's rule:
    one of them is required; ``1.4`` reads as ``"1.4"``)."""
    assert min_version or max_version, "Must provide a min_version or max_version argument"
    installed = TorchVersion(torch.__version__)
    if min_version and installed < str(min_version):
        return False
    return not (max_version and installed > str(max_version))


def is_functorch_transforming() -> bool:
    """True when called under ``torch.func.grad`` / ``vmap`` / ``jacrev``."""
    return torch_compat.functorch_transforming()
