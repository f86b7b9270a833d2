"""``deepspeed.utils``: ``logger`` (DeepSpeed's logger name and format) and ``log_dist``.

``safe_get_full_fp32_param`` / ``safe_get_full_grad`` are named here but not implemented:
they raise, pointing at ``deepspeed.zero.GatheredParameters`` for full weights.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterable
from typing import Any

import torch

from zerorun.compat.unsupported import unsupported

logger = logging.getLogger("DeepSpeed")
if not logger.handlers:  # DeepSpeed's logger prints INFO to stdout with its own prefix
    _handler = logging.StreamHandler(sys.stdout)
    _handler.setFormatter(logging.Formatter("[%(asctime)s] [%(levelname)s] [%(filename)s:%(lineno)d:%(funcName)s] "
                                            "%(message)s"))
    logger.addHandler(_handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False


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


_FULL_HINT = ("read full weights inside `with deepspeed.zero.GatheredParameters(params):`; "
              "the gradient norm is engine.get_global_grad_norm()")


def safe_get_full_fp32_param(param: torch.Tensor) -> torch.Tensor | None:
    """Not implemented: the fp32 master of one parameter, gathered from its shards."""
    unsupported("deepspeed.utils.safe_get_full_fp32_param", _FULL_HINT)


def safe_get_full_grad(param: torch.Tensor) -> torch.Tensor | None:
    """Not implemented: the reduced gradient of one parameter, gathered from its shards."""
    unsupported("deepspeed.utils.safe_get_full_grad", _FULL_HINT)


__all__ = ["log_dist", "logger", "print_json_dist", "safe_get_full_fp32_param", "safe_get_full_grad"]
