"""Full fp32 parameters and gradients of one parameter, whatever the stage (``deepspeed.utils.safe_get_*``)."""

from __future__ import annotations

import torch

from zerorun.compat.unsupported import unsupported


def full_fp32_param(param: torch.Tensor) -> torch.Tensor | None:
    unsupported("deepspeed.utils.safe_get_full_fp32_param (not yet wired)")


def full_grad(param: torch.Tensor) -> torch.Tensor | None:
    unsupported("deepspeed.utils.safe_get_full_grad (not yet wired)")
