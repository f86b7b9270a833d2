"""``deepspeed.runtime.utils``: ``set_random_seed`` and the small helpers scripts import."""

from __future__ import annotations

import random
from typing import Any

import torch


def set_random_seed(seed: int) -> None:
    """Seed Python's, numpy's (when installed) and torch's generators (all devices), as DeepSpeed does."""
    random.seed(seed)
    try:
        import numpy as np
    except ImportError:  # numpy is optional for zerorun
        pass
    else:
        np.random.seed(seed)
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)


def see_memory_usage(message: str, force: bool = False) -> None:
    """Print this process's memory (accelerator and host) when ``force`` is set, as DeepSpeed does."""
    if not force:
        return
    from zerorun.compat.accelerator import get_accelerator

    acc = get_accelerator()
    gib = 2**30
    print(f"{message} | allocated {acc.memory_allocated() / gib:.2f} GiB | "
          f"max allocated {acc.max_memory_allocated() / gib:.2f} GiB", flush=True)


def move_to_device(item: Any, device: Any, criterion_func: Any = None) -> Any:
    """Tensors in ``item`` (nested lists, tuples, dicts) on ``device``; with ``criterion_func``, a tensor
    it accepts is moved in place (its ``.data`` replaced), as DeepSpeed's."""
    if criterion_func is not None and criterion_func(item):
        item.data = item.to(device).data
        return item
    if isinstance(item, list):
        return [move_to_device(v, device, criterion_func) for v in item]
    if isinstance(item, tuple):
        return tuple(move_to_device(v, device, criterion_func) for v in item)
    if isinstance(item, dict):
        return {k: move_to_device(v, device, criterion_func) for k, v in item.items()}
    return item.to(device) if torch.is_tensor(item) else item


class RepeatingLoader:
    """Iterate ``loader`` forever, restarting it when it ends (DeepSpeed's ``RepeatingLoader``)."""

    def __init__(self, loader: Any) -> None:
        self.loader = loader
        self.data_iter = iter(loader)

    def __iter__(self) -> RepeatingLoader:
        return self

    def __next__(self) -> Any:
        try:
            return next(self.data_iter)
        except StopIteration:
            self.data_iter = iter(self.loader)
            return next(self.data_iter)


__all__ = ["RepeatingLoader", "move_to_device", "see_memory_usage", "set_random_seed"]
