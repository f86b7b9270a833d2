"""Stages 2 and 3 on the host: a Linear's weight gradient computed straight into its staging slot.

Stages 2 and 3 copy every gradient autograd hands over into a bucket-sized staging buffer and
free it (:mod:`zerorun.engine.mechanism.sharded_grads`). On the host that churn goes through
glibc: a weight's gradient is one large allocation per layer per backward, freed a moment later,
and the small tensors backward makes meanwhile are cut out of the holes it leaves, so the next
layer's gradient no longer fits and the heap grows (the memory benchmark's stage-3 tight window:
its peak 60-80 MiB over what its buffers hold, 1.06 of the floor with large buffers mapped on
their own against 1.14-1.16 on glibc's defaults). Mapping them on their own costs a page fault
per 4 KiB on every gradient (31% on the performance job), so the engine removes the allocation
instead.

Each ``nn.Linear`` (that class exactly) whose weight the engine reduces runs its forward through
:class:`_LandingLinear`: the same ``F.linear`` forward, and in backward the weight's gradient is
``mm(grad_outputᵀ, input, out=slot)``, the slot being the weight's place in its bucket's staging
buffer, claimed from the gradient sync (:meth:`ShardedGradSync.claim`). Autograd hands that view
to the parameter unchanged (no other reference holds it, its layout is the parameter's), and the
sync finds its gradient already in place: no allocation and no copy. The input's and the bias's
gradients are the ones ``F.linear``'s backward computes, bit for bit (the tests compare the three
with autograd's). Where a claim is refused (the slot holds this pass's gradient already: the
weight was used twice; another dtype; a backward that builds a graph), or the call is not a plain
one (autocast, an input of one dimension or not contiguous), the Linear computes as torch's does.

Installed at ``initialize`` on the host only (a GPU's caching allocator pools already) and
removed with the engine's hooks, or by ``engine.compile()`` (a compiled graph keeps the plain
Linear). ``ZERORUN_LAND_GRADS=0`` turns it off.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.function import FunctionCtx

ENV_SWITCH = "ZERORUN_LAND_GRADS"


class Site(Protocol):
    def claim(self, param: torch.Tensor, beside: torch.Tensor | None = None) -> torch.Tensor | None:
        """The staging view ``param``'s gradient may be computed into, or None (``beside``: a parameter
        whose gradient comes with it)."""


class _LandingLinear(torch.autograd.Function):
    @staticmethod
    def forward(bias: torch.Tensor | None, input: torch.Tensor, weight: torch.Tensor,  # type: ignore[override]  # noqa: A002
                site: weakref.ref[Site]) -> torch.Tensor:
        # the bias first, as addmm's: autograd then hands the bias its gradient before the weight, and a
        # bias in a bucket of its own is reduced before the weight's bucket waits for it (buckets go in order)
        return F.linear(input, weight, bias)

    @staticmethod
    def setup_context(ctx: FunctionCtx, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
        bias, input, weight = inputs[0], inputs[1], inputs[2]  # noqa: A001
        # as torch's linear: the weight only for the input's gradient, the input only for the weight's
        ctx.save_for_backward(input if weight.requires_grad else None, weight if input.requires_grad else None)
        ctx.input_shape = input.shape
        ctx.param = weight  # the parameter whose slot is claimed (a parameter outlives its backward anyway)
        ctx.bias = bias
        ctx.site = inputs[3]

    @staticmethod
    def backward(ctx: FunctionCtx, grad_output: torch.Tensor) -> tuple[torch.Tensor | None, ...]:  # type: ignore[override]
        input, weight = ctx.saved_tensors  # noqa: A001
        go = grad_output.reshape(-1, grad_output.shape[-1])
        grad_input = grad_weight = grad_bias = None
        if ctx.needs_input_grad[1]:
            grad_input = go.mm(weight).view(ctx.input_shape)
        if ctx.needs_input_grad[2]:
            site = ctx.site()
            slot = site.claim(ctx.param, ctx.bias) if site is not None and not torch.is_grad_enabled() else None
            grad_weight = torch.mm(go.t(), input.reshape(-1, input.shape[-1]), out=slot)
        if ctx.needs_input_grad[0]:
            grad_bias = go.sum(0)
        return grad_bias, grad_input, grad_weight, None


class _LandingForward:
    """``module.forward`` of a landed Linear. Pickled or copied, the module gets torch's own forward."""

    def __init__(self, module: nn.Linear, site: weakref.ref[Site]) -> None:
        self.module = weakref.ref(module)
        self.site = site

    def __call__(self, input: torch.Tensor) -> torch.Tensor:  # noqa: A002
        m = self.module()
        assert m is not None  # called through the module, which holds this
        if (torch.compiler.is_compiling() or input.dim() < 2 or not input.is_contiguous()
                or not torch.is_grad_enabled() or not m.weight.requires_grad
                or torch.is_autocast_enabled(input.device.type)):
            return F.linear(input, m.weight, m.bias)
        return _LandingLinear.apply(m.bias, input, m.weight, self.site)

    def __reduce__(self) -> tuple[Any, ...]:
        return _plain_forward, (self.module(),)


class Landed:
    """What :func:`install` changed, undone by :meth:`remove` (the engine's hooks are removed so)."""

    def __init__(self, modules: list[nn.Linear]) -> None:
        self.modules = [weakref.ref(m) for m in modules]

    def remove(self) -> None:
        for ref in self.modules:
            m = ref()
            if m is not None and isinstance(m.__dict__.get("forward"), _LandingForward):
                del m.__dict__["forward"]
        self.modules.clear()


def enabled(device: torch.device) -> bool:
    return device.type == "cpu" and os.environ.get(ENV_SWITCH, "1") != "0"


def install(root: nn.Module, site: Site, params: set[int]) -> Landed:
    """Land the weight gradients of every ``nn.Linear`` under ``root`` whose weight is in ``params`` (ids)."""
    ref = weakref.ref(site)
    landed = []
    for m in root.modules():
        if type(m) is nn.Linear and id(m.weight) in params and "forward" not in m.__dict__:
            m.forward = _LandingForward(m, ref)  # type: ignore[method-assign]
            landed.append(m)
    return Landed(landed)


def uninstall(root: nn.Module) -> None:
    """Every landed Linear under ``root`` back to torch's forward."""
    Landed([m for m in root.modules() if isinstance(m, nn.Linear)]).remove()


def _plain_forward(module: nn.Linear) -> Callable[[torch.Tensor], torch.Tensor]:
    """torch's forward bound to ``module`` (what an unpickled or copied landed Linear gets)."""
    return nn.Linear.forward.__get__(module)
