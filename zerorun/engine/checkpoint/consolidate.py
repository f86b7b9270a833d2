"""One full state dict from a sharded checkpoint, without a process group or the model's code.

``consolidate(checkpoint_dir)`` reassembles every parameter from the saved chunks of
all ranks (fp32 masters, or ``dtype``), adds the buffers and frozen parameters and the
tied aliases, so ``model.load_state_dict(result)`` works on a plain ``nn.Module``. The
reading is ``zero_to_fp32``'s (the script every save directory carries), so ``zerorun
convert`` and DeepSpeed's entry points give one state dict; DeepSpeed checkpoints convert too.
``write_state_dict`` saves it as ``.pt`` (torch.save) or ``.safetensors`` (optional
dependency).
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from zerorun.engine.checkpoint import safe_load, zero_to_fp32
from zerorun.engine.checkpoint.errors import CheckpointError
from zerorun.engine.checkpoint.load import is_tag, resolve
from zerorun.engine.checkpoint.manifest import LATEST, MANIFEST

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def checkpoint_path(path: str | os.PathLike[str], tag: str | None = None) -> Path:
    """Accept either a tag directory (zerorun's or DeepSpeed's) or a save directory (holding ``latest``)."""
    p = Path(path)
    if tag is None and is_tag(p):
        return p
    if not p.exists():
        raise CheckpointError(f"{p}: no such checkpoint directory", "pass the save_dir given to save_checkpoint "
                              "(or one of its tag directories)")
    if tag is None and not (p / LATEST).is_file():
        raise CheckpointError(f"{p} holds neither {MANIFEST} nor a '{LATEST}' file",
                              "pass the save_dir given to save_checkpoint or one of its tag directories")
    return resolve(p, tag)


def consolidate(path: str | os.PathLike[str], tag: str | None = None,
                dtype: torch.dtype = torch.float32, trust: bool = False) -> dict[str, torch.Tensor]:
    """The full state dict (``name -> tensor``) of the checkpoint at ``path``; tied names share one tensor.

    Every file loads as data only (``safe_load``); ``trust`` lets files the user vouches for name any global.
    """
    state = zero_to_fp32.state_dict_of_tag(checkpoint_path(path, tag), trust=trust,
                                           load=lambda f: safe_load.load(f, trust, what="rank file"))
    cast: dict[int, torch.Tensor] = {}
    for name, value in state.items():
        if value.is_floating_point():
            state[name] = cast.setdefault(id(value), value.to(dtype))
    return state


def write_state_dict(state: dict[str, torch.Tensor], out: str | os.PathLike[str]) -> Path:
    """Write ``state`` to ``out``: ``.safetensors`` by extension, else ``torch.save``."""
    from zerorun.engine.checkpoint.atomic import torch_save, write_bytes

    out_path = Path(out)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    if out_path.suffix == ".safetensors":
        try:
            from safetensors.torch import save as st_save
        except ImportError as e:
            raise CheckpointError(f"{out_path}: writing .safetensors needs the safetensors package",
                                  "pip install 'zerorun[safetensors]' (or pip install safetensors), "
                                  "or write a .pt file instead") from e
        # safetensors refuses tensors that share memory (tied weights): each gets its own copy
        write_bytes(out_path, st_save({k: v.contiguous().clone() for k, v in state.items()}))
    else:
        torch_save(state, out_path)
    return out_path


def convert(path: str | os.PathLike[str], out: str | os.PathLike[str], tag: str | None = None,
            dtype: str = "fp32", trust: bool = False) -> Path:
    """Consolidate the checkpoint at ``path`` and write it to ``out`` (``.pt`` or ``.safetensors``)."""
    if dtype not in DTYPES:
        raise CheckpointError(f"unknown dtype {dtype!r}", f"use one of {', '.join(DTYPES)}")
    return write_state_dict(consolidate(path, tag, DTYPES[dtype], trust), out)
