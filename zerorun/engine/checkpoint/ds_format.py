"""A DeepSpeed ZeRO checkpoint (stages 1-3) as full per-parameter tensors: masters and optimizer state.

DeepSpeed keeps, per parameter group, one flat fp32 vector split across the data-parallel
ranks, and the optimizer state (Adam's ``exp_avg``, ``exp_avg_sq``) over the same flat
coordinates; ``param_shapes`` gives the order of the parameters in it:

- stages 1-2: the ranks' slices, concatenated, are the group's flat vector; parameters
  follow one another (plus ``param_alignment_paddings`` after each), the last rank's
  master slice stops at the group's end while its optimizer tensors keep the padding;
- stage 3: every parameter is cut into ``ceil(numel / N)`` elements per rank, and rank r's
  flat vector is its piece of each parameter in turn (all groups, one after another).

Both layouts are undone here into ``name -> full tensor``; :mod:`ds_load` turns the
result into a checkpoint zerorun's resharding reads.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from zerorun.engine.checkpoint import ds_files
from zerorun.engine.checkpoint.errors import CheckpointError
from zerorun.engine.policy import policy_for_stage

# Keys of the model-states file that are DeepSpeed's own; DeepSpeed's load_checkpoint returns the others
# as the client state
DEEPSPEED_KEYS = ("module", "skipped_steps", "global_steps", "dp_world_size", "mp_world_size", "data_sampler",
                  "random_ltd", "lr_scheduler", "optimizer")


@dataclass
class DeepSpeedState:
    """What a DeepSpeed tag holds, with every flat layout undone."""

    stage: int
    world_size: int
    groups: list[dict[str, tuple[int, ...]]]  # per optimizer group: parameter name -> shape, in flat order
    masters: dict[str, torch.Tensor]  # fp32, full shape
    moments: dict[str, dict[str, torch.Tensor]]  # name -> {optimizer state key: full tensor}
    scalars: dict[str, Any]  # per-group optimizer state that is not per element (Adam's step)
    hyper: list[dict[str, Any]]  # the optimizer's param_groups, without "params"
    extra: dict[str, torch.Tensor] = field(default_factory=dict)  # buffers and frozen parameters
    aliases: dict[str, str] = field(default_factory=dict)  # tied name -> stored name
    model_state: dict[str, Any] = field(default_factory=dict)  # rank 0's model-states file
    loss_scaler: dict[str, Any] = field(default_factory=dict)  # DeepSpeed's LossScaler attributes (cur_scale, ...)

    def client_state(self) -> dict[str, Any]:
        return {k: v for k, v in self.model_state.items() if k not in DEEPSPEED_KEYS}


def _numel(shape: tuple[int, ...]) -> int:
    return math.prod(shape)


def _check_numel(wanted: int, have: int, at_most: bool) -> None:
    """The parameter shapes must fill the flat vector (stage 3) or fit in it (stages 1-2: alignment padding)."""
    if wanted > have or (not at_most and wanted != have):
        raise CheckpointError(f"the DeepSpeed checkpoint's param_shapes need {wanted} elements of a flat "
                              f"partition holding {have}: the model-states and optimizer-states files do not match",
                              "copy the model-states and *_optim_states.pt files of one save, from one tag directory")


def _stage12_group(slices: list[torch.Tensor], shapes: dict[str, tuple[int, ...]],
                   paddings: list[int] | None) -> dict[str, torch.Tensor]:
    flat = torch.cat([s.reshape(-1) for s in slices])
    _check_numel(sum(_numel(s) for s in shapes.values()) + sum(paddings or ()), flat.numel(), at_most=True)
    out: dict[str, torch.Tensor] = {}
    offset = 0
    for i, (name, shape) in enumerate(shapes.items()):
        out[name] = flat.narrow(0, offset, _numel(shape)).view(shape).clone()
        offset += _numel(shape) + (paddings[i] if paddings else 0)
    return out


def _stage3_all(flats: list[torch.Tensor], shapes: dict[str, tuple[int, ...]]) -> dict[str, torch.Tensor]:
    world = len(flats)
    _check_numel(sum(math.ceil(_numel(s) / world) for s in shapes.values()), flats[0].numel(), at_most=False)
    out: dict[str, torch.Tensor] = {}
    offset = 0
    for name, shape in shapes.items():
        part = math.ceil(_numel(shape) / world)
        pieces = [f.narrow(0, offset, part) for f in flats]
        out[name] = torch.cat(pieces)[:_numel(shape)].view(shape).clone()
        offset += part
    return out


def _group_states(sd: dict[str, Any], params_sharded: bool) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Per flat group: the torch optimizer's state, and its param_groups (hyper-parameters)."""
    base = sd.get("optimizer_state_dict" if params_sharded else "base_optimizer_state")
    if isinstance(base, list):  # elastic_checkpoint: per group, the state of the rank's slice, padding cut off
        step = sd.get("base_optimizer_state_step")
        return [{**({"step": step} if step is not None else {}), **s} for s in base], []
    if not isinstance(base, dict) or "state" not in base:
        raise CheckpointError("the DeepSpeed optimizer states are missing from the *_optim_states.pt files",
                              "load a checkpoint saved with its optimizer (DeepSpeed's save_checkpoint writes it)")
    groups = base["param_groups"]
    states = [base["state"].get(i, {}) for i in range(len(groups))]
    hyper = [{k: v for k, v in g.items() if k != "params"} for g in groups]
    return states, hyper


def _split(params_sharded: bool, per_rank: list[list[torch.Tensor]], groups: list[dict[str, tuple[int, ...]]],
           paddings: list[list[int]] | None) -> dict[str, torch.Tensor]:
    """``per_rank[r][g]``: rank r's flat slice of group g -> full tensor per parameter."""
    if params_sharded:
        merged = {k: v for g in groups for k, v in g.items()}
        return _stage3_all([torch.cat([t.reshape(-1) for t in groups_r]) for groups_r in per_rank], merged)
    out: dict[str, torch.Tensor] = {}
    for g, shapes in enumerate(groups):
        out.update(_stage12_group([r[g] for r in per_rank], shapes, paddings[g] if paddings else None))
    return out


def _moments(params_sharded: bool, states: list[list[dict[str, Any]]], groups: list[dict[str, tuple[int, ...]]],
             paddings: list[list[int]] | None) -> tuple[dict[str, dict[str, torch.Tensor]], dict[str, Any]]:
    """``states[r][g]``: rank r's optimizer state of flat group g -> per-parameter tensors and the scalars."""
    keys = [k for k, v in states[0][0].items() if torch.is_tensor(v) and v.dim() == 1] if states[0] else []
    scalars = {k: v for k, v in (states[0][0] if states[0] else {}).items() if k not in keys}
    moments: dict[str, dict[str, torch.Tensor]] = {}
    for key in keys:
        full = _split(params_sharded, [[s[key] for s in rank] for rank in states], groups, paddings)
        for name, t in full.items():
            moments.setdefault(name, {})[key] = t
    return moments, scalars


def _frozen(model_states: list[dict[str, Any]], params_sharded: bool) -> dict[str, torch.Tensor]:
    """Frozen (not optimized) parameters: whole at stages 1-2, one fragment per rank at stage 3."""
    shapes = model_states[0].get("frozen_param_shapes") or {}
    out: dict[str, torch.Tensor] = {}
    for name, shape in shapes.items():
        frags = [ms["frozen_param_fragments"][name].reshape(-1) for ms in model_states]
        flat = torch.cat(frags) if params_sharded else frags[0]
        out[name] = flat[:_numel(tuple(shape))].view(tuple(shape)).clone()
    if not params_sharded and not shapes:  # stage 1 saves no fragments: the module state dict holds them
        optimized = {n for g in model_states[0]["param_shapes"] for n in g}
        buffers = set(model_states[0].get("buffer_names", []))
        shared = set(model_states[0].get("shared_params", {}))
        out = {k: v for k, v in model_states[0]["module"].items()
               if k not in optimized and k not in buffers and k not in shared}
    return out


def read(tag_dir: Path, trust: bool = False) -> DeepSpeedState:
    """Every tensor of the DeepSpeed tag directory ``tag_dir``, as full per-parameter tensors.

    The files load as data (``ds_files.load``); ``trust`` lets them name any global."""
    optims = [ds_files.load(f, trust)["optimizer_state_dict"] for f in ds_files.optim_files(tag_dir)]
    stage = int(optims[0]["zero_stage"])
    params_sharded = policy_for_stage(stage).shard_parameters  # DeepSpeed's stage-3 layout
    world = optims[0]["partition_count"]
    world = max(world) if isinstance(world, list) else int(world)
    if world != len(optims):
        prefix = "bf16_" if ds_files.optim_files(tag_dir)[0].name.startswith("bf16_") else ""
        missing = [f"{prefix}zero_pp_rank_{r}_mp_rank_00_optim_states.pt" for r in range(len(optims), world)]
        raise CheckpointError(f"{tag_dir}: DeepSpeed saved {world} optimizer partitions; the optimizer-states "
                              f"file of rank(s) {list(range(len(optims), world))} is missing ({', '.join(missing)})",
                              "copy the whole tag directory every rank wrote, or load an earlier tag")
    model_states = [ds_files.load(f, trust) for f in ds_files.model_files(tag_dir, stage)]
    rank0 = model_states[0]
    groups = [{n: tuple(s) for n, s in g.items()} for g in rank0["param_shapes"]]
    key = "fp32_flat_groups" if params_sharded else "single_partition_of_fp32_groups"
    paddings = optims[0].get("param_alignment_paddings")
    masters = _split(params_sharded, [o[key] for o in optims], groups, paddings)
    per_rank = [_group_states(o, params_sharded) for o in optims]
    moments, scalars = _moments(params_sharded, [states for states, _ in per_rank], groups, paddings)
    buffers = {k: v for k, v in rank0["module"].items() if k in set(rank0.get("buffer_names", []))}
    return DeepSpeedState(stage=stage, world_size=world, groups=groups, masters=masters, moments=moments,
                          scalars=scalars, hyper=per_rank[0][1], extra={**buffers, **_frozen(model_states, params_sharded)},
                          aliases=dict(rank0.get("shared_params", {})), model_state=rank0,
                          loss_scaler=dict(getattr(optims[0].get("loss_scaler"), "state", None) or {}))
