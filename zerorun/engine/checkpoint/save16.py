"""``engine.save_16bit_model``: one file with the full parameters in the compute dtype.

Stages 0-2 hold whole parameters: the module's ``state_dict()`` is written as is. At
stage 3 ``engine.module.state_dict()`` holds empty placeholders for sharded parameters
(as DeepSpeed's does), so this gathers the parameters unit by unit - every rank takes
part in each all-gather, only one unit is whole at a time - copies them out, and
releases them again; rank 0 writes the file (to a fresh temporary name, fsynced, then renamed).
Stage 3 needs ``zero_optimization.stage3_gather_16bit_weights_on_model_save: true``.
``save_filename="model.safetensors"`` writes Hugging Face's layout instead (``hf_shards``:
one ``model.safetensors``, or ``model-0000k-of-0000n.safetensors`` and the index above 5 GB).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn

from zerorun import torch_compat
from zerorun.engine.checkpoint import atomic, hf_shards
from zerorun.engine.errors import EngineError
from zerorun.engine.mechanism.param_state import ParamState
from zerorun.engine.mechanism.partition import bucket_of

if TYPE_CHECKING:
    from zerorun.engine.views import ModelView

HF_SHARD_BYTES = 5 * 10**9  # Hugging Face's customary max_shard_size


def _gathered_state_dict(module: nn.Module, exclude_frozen: bool) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    copies: dict[int, torch.Tensor] = {}  # a tied parameter is one tensor under both names, as in state_dict()
    for prefix, m in module.named_modules(remove_duplicate=False):
        head = f"{prefix}." if prefix else ""
        for name, p in torch_compat.own_parameters(m).items():
            if p is None or (exclude_frozen and not p.requires_grad):
                continue
            if id(p) in copies:
                out[head + name] = copies[id(p)]
                continue
            b = bucket_of(p)
            was_sharded = b is not None and b.state is not ParamState.GATHERED
            if was_sharded:
                b.gather(exact=True)
            out[head + name] = copies[id(p)] = p.detach().clone().cpu()
            if was_sharded:
                b.release()
        for name, buf in torch_compat.own_buffers(m).items():
            if buf is not None and name not in torch_compat.non_persistent_buffers(m):
                out[head + name] = buf.detach().clone().cpu()
    return out


def consolidated_state_dict(engine: ModelView,
                            exclude_frozen_parameters: bool = False) -> dict[str, torch.Tensor]:
    """The full state dict in the compute dtype, on CPU, on every rank (a collective at stage 3)."""
    zero = engine.config.zero_optimization
    if engine.stage.shard_parameters:
        if not zero.stage3_gather_16bit_weights_on_model_save:
            raise EngineError("saving the 16-bit model at stage 3 needs the parameters gathered, which the config "
                              "does not allow",
                              "set zero_optimization.stage3_gather_16bit_weights_on_model_save: true "
                              "(or save a checkpoint and consolidate it)")
        return _gathered_state_dict(engine.module, exclude_frozen_parameters)
    return {k: v.detach().clone().cpu() for k, v in engine.module.state_dict().items()
            if not exclude_frozen_parameters or k not in _frozen_names(engine.module)}


def save_16bit_model(engine: ModelView, save_dir: str, save_filename: str = "pytorch_model.bin",
                     exclude_frozen_parameters: bool = False) -> bool:
    state = consolidated_state_dict(engine, exclude_frozen_parameters)
    if engine.ctx.rank == 0 and save_filename == hf_shards.SINGLE:  # Hugging Face's layout, sharded above 5GB
        hf_shards.write_hf(hf_shards.state_items(state, None), Path(save_dir), HF_SHARD_BYTES)
    elif engine.ctx.rank == 0:
        path = Path(save_dir) / save_filename
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic.torch_save(state, path)  # a fresh temporary name, fsynced, renamed; removed if the write fails
    return True


def _frozen_names(module: nn.Module) -> set[str]:
    return {n for n, p in module.named_parameters() if not p.requires_grad}
