"""``deepspeed.checkpoint.utils``: ``clone_tensors_for_torch_save`` (accelerate's get_state_dict calls it) and the
names of a DeepSpeed checkpoint's files in a tag folder (``get_model_ckpt_name_for_rank`` and its siblings)."""

from __future__ import annotations

import os
from typing import Any

import torch

MODEL_FILE_PREFIX, MODEL_FILE_SUFFIX = "mp_rank_", "_model_states.pt"
ZERO_FILE_PREFIX, OPTIM_FILE_SUFFIX = "zero_pp_rank_", "_optim_states.pt"


def get_model_ckpt_name_for_rank(base_folder: str, mp_rank_str: str) -> str:
    """``<tag folder>/mp_rank_<mp_rank_str>_model_states.pt``: the module's file (rank 0 writes it)."""
    return os.path.join(base_folder, f"{MODEL_FILE_PREFIX}{mp_rank_str}{MODEL_FILE_SUFFIX}")


def get_zero_ckpt_name_for_rank(base_folder: str, dp_rank: int, mp_rank: int) -> str:
    """``<tag folder>/zero_pp_rank_<dp>_mp_rank_<mp:02d>_optim_states.pt``: data-parallel rank ``dp_rank``'s shard."""
    return os.path.join(base_folder, f"{ZERO_FILE_PREFIX}{dp_rank}_{MODEL_FILE_PREFIX}{mp_rank:02d}{OPTIM_FILE_SUFFIX}")


def get_layer_ckpt_name_for_rank(base_folder: str, layer_id: str, tp_rank: int) -> str:
    """``<tag folder>/<layer_id>-model_<tp:02d>_model_states.pt`` (pipeline layers: zerorun writes none)."""
    return os.path.join(base_folder, f"{layer_id}-model_{tp_rank:02d}{MODEL_FILE_SUFFIX}")


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


__all__ = ["clone_tensors_for_torch_save", "get_layer_ckpt_name_for_rank", "get_model_ckpt_name_for_rank",
           "get_zero_ckpt_name_for_rank"]
