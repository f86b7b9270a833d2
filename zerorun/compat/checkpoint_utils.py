"""``deepspeed.checkpoint.utils``: ``clone_tensors_for_torch_save`` (accelerate's get_state_dict calls it)."""

from __future__ import annotations

from typing import Any

import torch


def clone_tensors_for_torch_save(item: Any, device: torch.device | str = "cpu") -> Any:
    """``item`` with every tensor cloned (detached) to ``device``, so a saved file holds only what it shows:
    a view would otherwise save its whole flat buffer. Lists, tuples and dicts are walked; a tensor met
    twice (tied weights) is cloned once, so savers still see the two names share it."""
    return _clone(item, torch.device(device), {})


def _clone(item: Any, device: torch.device, seen: dict[tuple[Any, ...], torch.Tensor]) -> Any:
    if torch.is_tensor(item):
        # state_dict() detaches each name anew: the same memory viewed the same way is the same tensor
        key = (item.data_ptr(), item.dtype, tuple(item.shape), item.stride(), item.device)
        if key not in seen:
            seen[key] = item.detach().clone().to(device)
        return seen[key]
    if isinstance(item, (list, tuple)):
        return type(item)(_clone(v, device, seen) for v in item)
    if isinstance(item, dict):
        return type(item)((k, _clone(v, device, seen)) for k, v in item.items())
    return item


__all__ = ["clone_tensors_for_torch_save"]
