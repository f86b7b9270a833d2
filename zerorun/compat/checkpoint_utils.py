"""``deepspeed.checkpoint.utils``: ``clone_tensors_for_torch_save`` (accelerate's get_state_dict calls it)."""

from __future__ import annotations

from typing import Any

import torch


def clone_tensors_for_torch_save(item: Any, device: torch.device | str = "cpu") -> Any:
    """``item`` with every tensor cloned (detached) to ``device``, so a saved file holds only what it shows:
    a view would otherwise save its whole flat buffer. Lists, tuples and dicts are walked."""
    if torch.is_tensor(item):
        return item.detach().clone().to(device)
    if isinstance(item, (list, tuple)):
        return type(item)(clone_tensors_for_torch_save(v, device) for v in item)
    if isinstance(item, dict):
        return type(item)((k, clone_tensors_for_torch_save(v, device)) for k, v in item.items())
    return item


__all__ = ["clone_tensors_for_torch_save"]
