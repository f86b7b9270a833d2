"""A DistributedSampler-backed DataLoader of the micro batch size (``training_data`` in initialize)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler


def build_dataloader(dataset: Dataset[Any], micro_batch_size: int, rank: int, world_size: int,
                     collate_fn: Callable[..., Any] | None = None, seed: int = 0) -> DataLoader[Any]:
    """Each rank reads its own 1/world of every epoch, ``micro_batch_size`` samples at a time.

    Like DeepSpeed's loader, the sampler shuffles (seeded identically on every rank) and
    the last incomplete batch is dropped so every rank runs the same number of steps.
    """
    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=seed,
                                 drop_last=True)
    return DataLoader(dataset, batch_size=micro_batch_size, sampler=sampler, collate_fn=collate_fn,
                      drop_last=True)
