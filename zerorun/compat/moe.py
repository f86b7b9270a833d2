"""``deepspeed.moe.utils``: DeepSpeed's MoE helpers, answered for models without experts.

zerorun has no expert parallelism: ``deepspeed.moe.layer.MoE`` cannot be built, so no
module is an MoE layer and no parameter is an expert parameter (DeepSpeed marks those
with ``param.allreduce = False``). The helpers below give DeepSpeed 0.19.8's answers in
that case (dense scripts that call them unconditionally, as CIFAR does, run unchanged);
a parameter marked as an expert's is an error naming the feature.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from zerorun.errors import unsupported

_FEATURE = "mixture of experts (expert parameters, deepspeed.moe)"


def is_moe_param(param: torch.Tensor) -> bool:
    """DeepSpeed's test: an expert parameter has ``allreduce`` set to False."""
    return hasattr(param, "allreduce") and not param.allreduce


def _no_experts(params: Any) -> list[Any]:
    params = list(params)
    if any(is_moe_param(p) for p in params):
        unsupported(_FEATURE, "zerorun trains dense models only; run MoE models with real DeepSpeed")
    return params


def has_moe_layers(m: nn.Module) -> tuple[bool, int]:
    """``(False, 0)``: no module can be a DeepSpeed MoE layer here."""
    return False, 0


def split_params_into_shared_and_expert_params(params: list[nn.Parameter]) -> tuple[list[nn.Parameter], list[Any]]:
    return _no_experts(params), []


def split_params_grads_into_shared_and_expert_params(group: list[nn.Parameter]) -> tuple[list[torch.Tensor],
                                                                                           list[Any]]:
    return [p.grad.to(p.dtype) for p in _no_experts(group) if p.grad is not None], []


def split_params_into_different_moe_groups_for_optimizer(param_groups: Any, max_group_size: int | float | None
                                                         = 178956971) -> list[dict[str, Any]]:
    """The groups as a list (a dict or tuple becomes one, as in DeepSpeed), each unchanged: no MoE groups."""
    if isinstance(param_groups, tuple):
        param_groups = list(param_groups)
    elif isinstance(param_groups, dict):
        param_groups = [param_groups]
    elif not isinstance(param_groups, list):
        raise ValueError(f"Unknown param group type of {type(param_groups)}")  # DeepSpeed's own error
    for group in param_groups:
        _no_experts(group["params"])
    return param_groups


def is_moe_param_group(param_group: dict[str, Any]) -> bool:
    return bool(param_group.get("moe", False))


def configure_moe_param_groups(model_parameters: list[Any]) -> list[Any]:
    """DeepSpeed's wrapping: a list of parameters becomes one ``dense-params`` group; groups stay as given."""
    if not isinstance(model_parameters, list):
        raise TypeError("model_parameters must be a list")
    if model_parameters and isinstance(model_parameters[0], nn.Parameter):
        return split_params_into_different_moe_groups_for_optimizer({"params": model_parameters,
                                                                     "name": "dense-params"})
    return split_params_into_different_moe_groups_for_optimizer(model_parameters)


__all__ = ["configure_moe_param_groups", "has_moe_layers", "is_moe_param", "is_moe_param_group",
           "split_params_grads_into_shared_and_expert_params", "split_params_into_different_moe_groups_for_optimizer",
           "split_params_into_shared_and_expert_params"]
