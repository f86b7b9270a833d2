"""``deepspeed.runtime.utils``: ``set_random_seed`` and the small helpers scripts import."""

from __future__ import annotations

import random

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


__all__ = ["see_memory_usage", "set_random_seed"]
