"""``deepspeed.utils``: ``logger``, ``log_dist`` and the ``safe_get_*`` accessors of full tensors.

``safe_get_full_fp32_param(p)`` / ``safe_get_full_grad(p)`` return the whole fp32
parameter / gradient of ``p`` on every rank whatever the stage (a collective: every
rank calls it), as DeepSpeed's do. They read the engine that owns ``p``.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterable
from typing import Any

import torch

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


def safe_get_full_fp32_param(param: torch.Tensor) -> torch.Tensor | None:
    """The full fp32 value of ``param`` on every rank (gathers shards at stage 3)."""
    from zerorun.compat.full_tensors import full_fp32_param

    return full_fp32_param(param)


def safe_get_full_grad(param: torch.Tensor) -> torch.Tensor | None:
    """The full, reduced fp32 gradient of ``param`` on every rank, after ``backward`` (None if it has none)."""
    from zerorun.compat.full_tensors import full_grad

    return full_grad(param)


__all__ = ["log_dist", "logger", "print_json_dist", "safe_get_full_fp32_param", "safe_get_full_grad"]
