"""``deepspeed.ops.adam``: ``DeepSpeedCPUAdam`` and ``FusedAdam`` on torch's Adam.

Both are :class:`torch.optim.Adam` with DeepSpeed's argument names and semantics:
``adam_w_mode`` / ``adamw_mode`` (default True) selects decoupled weight decay (AdamW),
False the L2 form (Adam); ``bias_correction=False`` drops Adam's bias corrections
(``p -= lr * m / (sqrt(v) + eps)``), which torch does not offer, so that case takes the
small explicit update below. ``amsgrad`` is refused as DeepSpeed refuses it. The update
is the same one DeepSpeed's CPU and CUDA kernels compute. Both build torch's fused kernel
where this torch fuses Adam (CPU and CUDA, torch >= 2.4), foreach otherwise: on the CPU the
fused kernel steps as fast as DeepSpeedCPUAdam's AVX one (BENCHMARKS.md, host step), where
torch's default for CPU tensors is its for-loop, ~8x slower.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from typing import Any

import torch

from zerorun.engine.training.host_kernel import fuses_on_cpu
from zerorun.errors import unsupported

# torch's Adam takes ``decoupled_weight_decay`` (AdamW's update) in newer releases, not in 2.6.0; where it does
# not, the decay is applied here, as torch's AdamW applies it (``p *= 1 - lr * wd`` before the Adam update), and
# Adam runs without it
_ADAM_DECOUPLES = "decoupled_weight_decay" in inspect.signature(torch.optim.Adam).parameters


class _DeepSpeedAdam(torch.optim.Adam):
    """torch Adam(W) with DeepSpeed's constructor and an optional bias-correction-free update."""

    zerorun_adam_state = True  # its step reads torch's Adam keys alone: the engine may make them up front

    def __init__(self, params: Iterable[Any], lr: float, bias_correction: bool, betas: tuple[float, float],
                 eps: float, weight_decay: float, amsgrad: bool, adamw: bool) -> None:
        if amsgrad:
            unsupported(f"{type(self).__name__}(amsgrad=True)", "DeepSpeed's Adam kernels have no AMSGrad variant; "
                        "use torch.optim.Adam(amsgrad=True) as a client optimizer")
        self.bias_correction = bias_correction
        self.adam_w_mode = adamw
        params = list(params)
        kwargs: dict[str, Any] = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay)
        if _ADAM_DECOUPLES:
            kwargs["decoupled_weight_decay"] = adamw
        if fuses_on_cpu(torch.optim.Adam):
            try:
                super().__init__(params, **kwargs, fused=True)
                return
            except RuntimeError:  # a parameter on a device torch does not fuse for: foreach there
                pass
        super().__init__(params, **kwargs, foreach=True)

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        if self.bias_correction and self.adam_w_mode and not _ADAM_DECOUPLES:
            return self._decoupled_step(closure)
        if self.bias_correction:
            return super().step(closure)
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            self._plain_update(group)
        return loss

    def _decoupled_step(self, closure: Callable[[], float] | None) -> float | None:
        """AdamW's update on a torch whose Adam has no ``decoupled_weight_decay``: the decay first, then
        Adam without it (the group keeps its ``weight_decay`` for everyone who reads it)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        decays = [group["weight_decay"] for group in self.param_groups]
        try:
            for group, wd in zip(self.param_groups, decays, strict=True):
                if wd:
                    for p in group["params"]:
                        if p.grad is not None:
                            p.mul_(1 - group["lr"] * wd)
                group["weight_decay"] = 0.0
            super().step()
        finally:
            for group, wd in zip(self.param_groups, decays, strict=True):
                group["weight_decay"] = wd
        return loss

    def _plain_update(self, group: dict[str, Any]) -> None:
        """Adam without bias correction, weight decay as ``adam_w_mode`` says (DeepSpeed's formula)."""
        beta1, beta2 = group["betas"]
        lr, eps, wd = group["lr"], group["eps"], group["weight_decay"]
        for p in group["params"]:
            if p.grad is None:
                continue
            grad = p.grad
            state = self.state[p]
            if not state:
                state["step"] = torch.tensor(0.0)
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state["step"] += 1
            if wd:
                if self.adam_w_mode:
                    p.mul_(1 - lr * wd)
                else:
                    grad = grad.add(p, alpha=wd)
            state["exp_avg"].lerp_(grad, 1 - beta1)
            state["exp_avg_sq"].mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
            p.addcdiv_(state["exp_avg"], state["exp_avg_sq"].sqrt().add_(eps), value=-lr)


class DeepSpeedCPUAdam(_DeepSpeedAdam):
    """DeepSpeed's CPU Adam: ``DeepSpeedCPUAdam(model_params, lr, bias_correction, betas, eps, weight_decay,
    amsgrad, adamw_mode, fp32_optimizer_states)``."""

    def __init__(self, model_params: Iterable[Any], lr: float = 1e-3, bias_correction: bool = True,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0.0,
                 amsgrad: bool = False, adamw_mode: bool = True, fp32_optimizer_states: bool = True) -> None:
        super().__init__(model_params, lr, bias_correction, betas, eps, weight_decay, amsgrad, adamw_mode)


class FusedAdam(_DeepSpeedAdam):
    """DeepSpeed's fused Adam: ``FusedAdam(params, lr, bias_correction, betas, eps, adam_w_mode, weight_decay,
    amsgrad, set_grad_none)``."""

    def __init__(self, params: Iterable[Any], lr: float = 1e-3, bias_correction: bool = True,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8, adam_w_mode: bool = True,
                 weight_decay: float = 0.0, amsgrad: bool = False, set_grad_none: bool = True) -> None:
        super().__init__(params, lr, bias_correction, betas, eps, weight_decay, amsgrad, adam_w_mode)
        self.set_grad_none = set_grad_none


__all__ = ["DeepSpeedCPUAdam", "FusedAdam"]
