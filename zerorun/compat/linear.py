"""``deepspeed.runtime.zero.linear``: ``LinearFunctionForZeroStage3`` and ``zero3_linear_wrap``.

DeepSpeed's memory-efficient linear, an autograd Function with DeepSpeed 0.19.8's semantics:

* ``forward(input, weight, bias=None)`` without ``ctx`` (``addmm`` for a 2-D input with a bias,
  else ``matmul`` then the bias added), ``setup_context`` apart and ``generate_vmap_rule``, so
  ``torch.func`` transforms (``grad``, ``vmap``) take it;
* ``setup_context`` records the autocast state of the forward (``ctx._dtype``, the autocast dtype of
  the accelerator's device type; ``ctx._fwd_used_autocast``) and saves the input, weight and bias;
* ``backward`` runs under that same autocast state (explicitly off when the forward ran without
  it, so an autocast region around ``loss.backward()`` does not change the gradients' dtype);
* a stage-3 weight released when backward reaches it (``ds_status`` ``NOT_AVAILABLE``) is
  gathered (``weight.all_gather()``) for the backward and released after (``weight.partition()``).

A deliberate difference: DeepSpeed installs ``zero3_linear_wrap`` as ``torch.nn.functional.linear``
under ``zero.Init`` (``mem_efficient_linear``, on by default; the patch persists until reset).
zerorun never does: a released stage-3 bucket frees its storage in place, so what torch's own linear
saves for backward holds no bytes (the patch's purpose), and replacing a torch function for the
whole process is a side effect zerorun does not take. Calling it directly works as DeepSpeed's.
"""

from __future__ import annotations

from typing import Any

import torch

from zerorun.compat.accelerator import get_accelerator
from zerorun.engine.surface.ds_param_attrs import is_zero_param


def _device_type() -> str:
    return get_accelerator().device_name()


def _is_released_zero_param(weight: torch.Tensor) -> bool:
    """A stage-3 parameter whose bucket is not gathered now (DeepSpeed's ``NOT_AVAILABLE``)."""
    return is_zero_param(weight) and getattr(getattr(weight, "ds_status", None), "name", None) == "NOT_AVAILABLE"


class LinearFunctionForZeroStage3(torch.autograd.Function):
    """``y = input @ weight.T + bias`` with DeepSpeed's backward (see the module docstring)."""

    generate_vmap_rule = True

    @staticmethod
    def forward(input: torch.Tensor, weight: torch.Tensor,  # type: ignore[override]  # noqa: A002  DeepSpeed's names
                bias: torch.Tensor | None = None) -> torch.Tensor:
        if input.dim() == 2 and bias is not None:
            return torch.addmm(bias, input, weight.t())  # fused: one kernel
        out = input.matmul(weight.t())
        if bias is not None:
            out += bias
        return out

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
        device_type = _device_type()
        ctx._dtype = torch.get_autocast_dtype(device_type)
        ctx._fwd_used_autocast = torch.is_autocast_enabled(device_type)
        bias = inputs[2] if len(inputs) > 2 else None
        ctx.save_for_backward(inputs[0], inputs[1], bias)

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor | None, ...]:  # type: ignore[override]
        with torch.autocast(device_type=_device_type(), enabled=ctx._fwd_used_autocast, dtype=ctx._dtype):
            input, weight, bias = ctx.saved_tensors  # noqa: A001  the forward's names
            gathered_here = _is_released_zero_param(weight)
            if gathered_here:
                weight.all_gather()
            try:
                return _grads(ctx.needs_input_grad, grad_output, input, weight, bias)
            finally:
                if gathered_here:
                    weight.partition()


def _grads(needs: tuple[bool, ...], grad_output: torch.Tensor, input: torch.Tensor,  # noqa: A002
           weight: torch.Tensor, bias: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
    """The input's, weight's and bias's gradients for a 1-D (one sample), 2-D or batched (>2-D) input."""
    dim = grad_output.dim()
    grad_input = grad_output.matmul(weight) if needs[0] else None
    grad_weight = grad_bias = None
    if needs[1]:
        if dim > 2:
            grad_weight = grad_output.reshape(-1, grad_output.shape[-1]).t().matmul(input.reshape(-1, input.shape[-1]))
        elif dim == 1:
            grad_weight = grad_output.unsqueeze(-1) * input.unsqueeze(0)
        else:
            grad_weight = grad_output.t().matmul(input)
    if bias is not None and needs[2]:
        grad_bias = grad_output.sum(tuple(range(dim - 1))) if dim > 1 else grad_output
    return grad_input, grad_weight, grad_bias


def zero3_linear_wrap(input: torch.Tensor, weight: torch.Tensor,  # noqa: A002  DeepSpeed's argument names
                      bias: torch.Tensor | None = None) -> torch.Tensor:
    """DeepSpeed's memory-efficient ``F.linear``: :class:`LinearFunctionForZeroStage3` applied. zerorun never
    installs it as ``torch.nn.functional.linear`` (see the module docstring)."""
    return LinearFunctionForZeroStage3.apply(input, weight, bias)


__all__ = ["LinearFunctionForZeroStage3", "zero3_linear_wrap"]
