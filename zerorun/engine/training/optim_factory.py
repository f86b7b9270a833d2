"""Optimizers named in the config (``optimizer.type`` / ``optimizer.params``), built from torch.optim.

DeepSpeed's parameter names are accepted (``lr``, ``betas``, ``eps``, ``weight_decay``,
``momentum``...). As in DeepSpeed, ``Adam`` means decoupled weight decay (AdamW)
unless ``adam_w_mode: false``; ``fused: true`` selects torch's fused kernel; without ``fused``/``foreach`` in the config, a host step
(``host_step``: the masters are offloaded) gets torch's fused CPU kernel where the class has one, and
every other step foreach (:mod:`zerorun.engine.training.host_kernel`). The optimizer is first built over
the module's parameters; the engine
then re-points its parameter groups at the flat fp32 master tensors
(:meth:`MasterShards.bind_optimizer`), so foreach kernels step a few large tensors.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from zerorun.config.builder_signatures import DROPPED
from zerorun.engine.errors import EngineError
from zerorun.engine.training.host_kernel import kernel_kwargs

_CLASSES: dict[str, type[torch.optim.Optimizer]] = {
    name.lower(): cls for name, cls in vars(torch.optim).items()
    if isinstance(cls, type) and issubclass(cls, torch.optim.Optimizer) and cls is not torch.optim.Optimizer
}
# DeepSpeed-only keys that torch's constructors do not take; ignored here with a reason.
_DROPPED = DROPPED


def build_optimizer(type_name: str, params: dict[str, Any], model_parameters: Iterable[Any],
                    host_step: bool = False) -> torch.optim.Optimizer:
    cls = _CLASSES.get(type_name.lower())
    if cls is None:
        raise EngineError(f"optimizer.type {type_name!r} is not supported by the engine",
                          "use a torch.optim class name such as Adam, AdamW or SGD, "
                          "or pass your own optimizer to initialize(optimizer=...)")
    kwargs = {k: v for k, v in params.items() if k not in _DROPPED}
    if "betas" in kwargs:
        kwargs["betas"] = tuple(kwargs["betas"])
    if type_name.lower() in ("adam", "adamw") and not params.get("torch_adam", False):
        # DeepSpeed builds FusedAdam / DeepSpeedCPUAdam, whose weight_decay defaults to 0 (torch's AdamW: 0.01)
        kwargs.setdefault("weight_decay", 0.0)
    if type_name.lower() == "adam" and params.get("adam_w_mode", True):
        # DeepSpeed's "Adam" applies decoupled weight decay (AdamW) unless adam_w_mode is false.
        cls = torch.optim.AdamW
    params_list = list(model_parameters)
    kernel = kernel_kwargs(cls, kwargs, host_step)
    if kernel:
        try:
            return cls(params_list, **{**kernel, **kwargs})
        except (TypeError, RuntimeError):
            pass  # the kernel does not take these parameters (e.g. fused with differentiable): torch's default
    try:
        return cls(params_list, **kwargs)
    except TypeError as e:
        raise EngineError(f"optimizer.params for {type_name}: {e}",
                          f"use the parameter names of torch.optim.{cls.__name__}") from e
