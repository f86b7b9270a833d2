"""``deepspeed.utils``: ``logger`` (DeepSpeed's logger name and format), ``log_dist``, the
``safe_get_*``/``safe_set_*`` accessors of one parameter's engine state, and the stage-3
leaf-module flags (:mod:`zerorun.compat.leaf_modules`).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterable
from typing import Any

import torch

from zerorun.compat.leaf_modules import (  # noqa: F401  deepspeed.utils exports them
    get_z3_leaf_modules,
    set_z3_leaf_module,
    set_z3_leaf_modules,
    set_z3_leaf_modules_by_name,
    set_z3_leaf_modules_by_suffix,
    unset_z3_leaf_modules,
    z3_leaf_module,
    z3_leaf_parameter,
)
from zerorun.compat.runtime_utils import RepeatingLoader  # noqa: F401  deepspeed.utils exports it
from zerorun.engine.surface import fragments

logger = logging.getLogger("DeepSpeed")
if not logger.handlers:  # DeepSpeed's logger prints INFO to stdout with its own prefix
    _handler = logging.StreamHandler(sys.stdout)
    _handler.setFormatter(logging.Formatter("[%(asctime)s] [%(levelname)s] [%(filename)s:%(lineno)d:%(funcName)s] "
                                            "%(message)s"))
    logger.addHandler(_handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False


LOG_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR,
              "critical": logging.CRITICAL}
"""The level names ``set_log_level_from_string`` takes (DeepSpeed's five)."""


def get_log_level_from_string(log_level_str: str) -> int:
    """The ``logging`` level a name stands for (``"info"`` -> ``logging.INFO``), case-insensitive."""
    level = LOG_LEVELS.get(log_level_str.lower())
    if level is None:
        raise ValueError(f"{log_level_str} is not one of the valid logging levels. "
                         f"Valid log levels are {list(LOG_LEVELS)}.")
    return level


def set_log_level_from_string(log_level_str: str, custom_logger: logging.Logger | None = None) -> None:
    """Set ``custom_logger`` (by default DeepSpeed's ``logger``) and its handlers to the named level."""
    level = get_log_level_from_string(log_level_str)
    target = logger if custom_logger is None else custom_logger
    target.setLevel(level)
    for handler in target.handlers:
        handler.setLevel(level)


def _rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_initialized() else 0


def log_dist(message: str, ranks: Iterable[int] | None = None, level: int = logging.INFO) -> None:
    """Log ``message`` on the given ranks (default: rank 0; ``[-1]``: every rank)."""
    ranks = list(ranks) if ranks is not None else [0]
    rank = _rank()
    if -1 in ranks or rank in ranks:
        logger.log(level, f"[Rank {rank}] {message}")


def print_json_dist(message: Any, ranks: Iterable[int] | None = None, path: str | None = None) -> None:
    import json

    log_dist(json.dumps(message), ranks)


# ---- one parameter's engine state (zerorun.engine.surface.fragments); the engine is found from the parameter ----
# As in DeepSpeed: the full getters are collectives (every rank calls them), a parameter no
# engine trains gives None, and the setters write this rank's fragment (the next step uses it).

def _engine(param: torch.Tensor) -> Any | None:
    return fragments.engine_of(param)


def safe_get_full_fp32_param(param: torch.Tensor) -> torch.Tensor | None:
    """The fp32 master of ``param``, whole, on every rank."""
    engine = _engine(param)
    return None if engine is None else fragments.full(engine, param, "fp32")


def safe_set_full_fp32_param(param: torch.Tensor, value: torch.Tensor) -> None:
    """Set the fp32 master of ``param`` from the full ``value`` (its compute copy follows at the next step)."""
    if (engine := _engine(param)) is not None:
        fragments.set_full(engine, param, value, "fp32")


def safe_get_full_optimizer_state(param: torch.Tensor, optim_state_key: str) -> torch.Tensor | None:
    """The optimizer state ``optim_state_key`` (e.g. ``exp_avg``) of ``param``, whole, on every rank."""
    engine = _engine(param)
    return None if engine is None else fragments.full(engine, param, optim_state_key)


def safe_set_full_optimizer_state(param: torch.Tensor, value: torch.Tensor, optim_state_key: str) -> None:
    if (engine := _engine(param)) is not None:
        fragments.set_full(engine, param, value, optim_state_key)


def safe_get_full_grad(param: torch.Tensor) -> torch.Tensor | None:
    """The reduced gradient of ``param`` (fp32, whole, on every rank): after backward, before step."""
    engine = _engine(param)
    if engine is None:
        return param.grad
    return fragments.full(engine, param, "grad")


def safe_set_full_grad(param: torch.Tensor, value: torch.Tensor) -> None:
    if (engine := _engine(param)) is not None:
        fragments.set_full(engine, param, value, "grad")
    elif param.grad is not None:
        param.grad.copy_(value)


def safe_update_full_grad_vectorized(param_list: list[torch.Tensor], update_func: Any) -> None:
    """``update_func(full_grad, param)`` -> the new gradient, for each parameter."""
    for p in param_list:
        if p.requires_grad and (grad := safe_get_full_grad(p)) is not None:
            safe_set_full_grad(p, update_func(grad, p))


def _local_engine(param: torch.Tensor, api: str) -> Any | None:
    """The engine training ``param``; None for a frozen parameter of an engine's model (DeepSpeed's local
    getters give None for one, its setters do nothing); a parameter of no engine's model is an error."""
    engine = _engine(param)
    frozen_in_a_model = getattr(param, "ds_id", None) is not None and not param.requires_grad
    if engine is None and not frozen_in_a_model:
        from zerorun.engine.errors import EngineError

        raise EngineError(f"deepspeed.utils.{api}: the parameter is not trained by an engine",
                          "pass a parameter of the model given to deepspeed.initialize()")
    return engine


# The local forms: this rank's fragment of the parameter, 1-D (zerorun shards whole buckets, so the
# fragment is the part of the parameter inside this rank's chunk; it may be empty).
def _get_local(param: torch.Tensor, what: str, api: str) -> torch.Tensor | None:
    engine = _local_engine(param, api)
    return None if engine is None else fragments.local(engine, param, what)


def _set_local(param: torch.Tensor, value: torch.Tensor, what: str, api: str) -> None:
    if (engine := _local_engine(param, api)) is not None:
        fragments.set_local(engine, param, value, what)


def safe_get_local_fp32_param(param: torch.Tensor) -> torch.Tensor | None:
    return _get_local(param, "fp32", "safe_get_local_fp32_param")


def safe_get_local_grad(param: torch.Tensor) -> torch.Tensor | None:
    return _get_local(param, "grad", "safe_get_local_grad")


def safe_get_local_optimizer_state(param: torch.Tensor, optim_state_key: str) -> torch.Tensor | None:
    return _get_local(param, optim_state_key, "safe_get_local_optimizer_state")


def safe_set_local_fp32_param(param: torch.Tensor, value: torch.Tensor) -> None:
    _set_local(param, value, "fp32", "safe_set_local_fp32_param")


def safe_set_local_grad(param: torch.Tensor, value: torch.Tensor) -> None:
    _set_local(param, value, "grad", "safe_set_local_grad")


def safe_set_local_optimizer_state(param: torch.Tensor, value: torch.Tensor, optim_state_key: str) -> None:
    _set_local(param, value, optim_state_key, "safe_set_local_optimizer_state")


__all__ = ["RepeatingLoader", "get_log_level_from_string", "get_z3_leaf_modules", "log_dist", "logger",
           "print_json_dist", "safe_get_full_fp32_param",
           "safe_get_full_grad", "safe_get_full_optimizer_state", "safe_get_local_fp32_param",
           "safe_get_local_grad", "safe_get_local_optimizer_state", "safe_set_full_fp32_param",
           "safe_set_full_grad", "safe_set_full_optimizer_state", "safe_set_local_fp32_param",
           "safe_set_local_grad", "safe_set_local_optimizer_state", "safe_update_full_grad_vectorized",
           "set_log_level_from_string", "set_z3_leaf_module", "set_z3_leaf_modules", "set_z3_leaf_modules_by_name",
           "set_z3_leaf_modules_by_suffix", "unset_z3_leaf_modules", "z3_leaf_module", "z3_leaf_parameter"]
