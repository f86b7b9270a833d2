"""Process-group bootstrap from the launcher's environment (also torchrun's).

``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT`` name the job.
NCCL when CUDA is available, gloo otherwise. With no ``WORLD_SIZE`` in the environment a
plain ``python train.py`` is a world of one (an in-memory store, no network). A default
process group the script already created is reused, never re-created.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from zerorun.engine.errors import EngineError

_REQUIRED = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@dataclass(frozen=True)
class DistContext:
    """Where this process sits in the job."""

    rank: int
    world_size: int
    local_rank: int
    backend: str
    device: torch.device
    group: dist.ProcessGroup | None


def default_backend() -> str:
    return "nccl" if torch.cuda.is_available() else "gloo"


def _device(backend: str, local_rank: int) -> torch.device:
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def init_distributed(dist_backend: str | None = None, timeout: timedelta = timedelta(minutes=30),
                     init_method: str | None = None) -> DistContext:
    """Join (or reuse) the default process group and return this rank's :class:`DistContext`."""
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if dist.is_initialized():
        backend = dist.get_backend()
        return DistContext(dist.get_rank(), dist.get_world_size(), local_rank, backend,
                           _device(backend, local_rank), dist.group.WORLD)
    backend = dist_backend or default_backend()
    if init_method is None and "WORLD_SIZE" not in os.environ:
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
        return DistContext(0, 1, 0, backend, _device(backend, 0), dist.group.WORLD)
    missing = [k for k in _REQUIRED if k not in os.environ]
    if init_method is None and missing:
        raise EngineError(f"WORLD_SIZE is set but {', '.join(missing)} {'is' if len(missing) == 1 else 'are'} not",
                          "start the script with `zerorun --num_gpus N script.py` or torchrun, "
                          "which set RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT for every rank")
    dist.init_process_group(backend, init_method=init_method or "env://", timeout=timeout)
    rank, world = dist.get_rank(), dist.get_world_size()
    return DistContext(rank, world, local_rank, backend, _device(backend, local_rank), dist.group.WORLD)
