"""A DeepSpeed checkpoint seen as a zerorun checkpoint saved at world size 1.

:func:`as_zerorun` lays the full tensors of :mod:`ds_format` out as one bucket per
DeepSpeed parameter group (no padding) and builds the one rank file such a checkpoint
would hold, so ``engine.load_checkpoint`` reshards it into any world size and stage
through the same ``reshard.plan_copies`` path as its own checkpoints.

What carries over, as DeepSpeed's own ``load_checkpoint`` does it: the fp32 masters, the
optimizer state and hyper-parameters, ``global_steps`` and ``skipped_steps``, the
scheduler's state, the buffers and frozen parameters, and the client state (every key
of the model-states file that is not DeepSpeed's). The global RNG is left alone
(DeepSpeed saves none).
"""

from __future__ import annotations

from dataclasses import asdict
from typing import TYPE_CHECKING, Any

import torch

from zerorun import __version__
from zerorun.engine.checkpoint import state as small_state
from zerorun.engine.checkpoint.ds_format import DeepSpeedState
from zerorun.engine.checkpoint.manifest import BucketEntry, Manifest, ParamEntry

if TYPE_CHECKING:
    from zerorun.engine.training.schedulers import LRSchedulerLike
    from zerorun.engine.views import CheckpointView

# torch.optim flags that describe this run's kernels, not the training state: the loading engine keeps its own
_IMPLEMENTATION_FLAGS = {"foreach", "fused", "capturable", "differentiable"}


def _bucket(shapes: dict[str, tuple[int, ...]], index: int) -> BucketEntry:
    params, offset = [], 0
    for name, shape in shapes.items():
        numel = torch.Size(shape).numel()
        params.append(ParamEntry(name, shape, offset, numel))
        offset += numel
    return BucketEntry(index, max(offset, 1), tuple(params))


def _flat(parts: list[torch.Tensor], numel: int) -> torch.Tensor:
    flat = torch.cat([p.reshape(-1).float() for p in parts]) if parts else torch.zeros(0, device="cpu")
    return torch.cat([flat, torch.zeros(numel - flat.numel(), device="cpu")]) if flat.numel() < numel else flat


def _bucket_payload(ds: DeepSpeedState, entry: BucketEntry) -> dict[str, Any]:
    names = [p.name for p in entry.params]
    opt: dict[str, Any] = {}
    keys = {k for n in names for k in ds.moments.get(n, {})}
    for key in sorted(keys):
        parts = [ds.moments[n][key] for n in names]
        opt[key] = _flat(parts, entry.padded_numel).to(parts[0].dtype)
    for key, value in ds.scalars.items():
        opt[key] = value.clone() if torch.is_tensor(value) else value
    return {"master": _flat([ds.masters[n] for n in names], entry.padded_numel), "state": opt}


def _scheduler_state(saved: dict[str, Any] | None,
                     scheduler: LRSchedulerLike | None) -> dict[str, Any] | None:
    """DeepSpeed's schedulers save only ``last_batch_iteration`` (zerorun's too); anything else a scheduler's own
    state holds is the loading engine's, which comes from the same configuration."""
    if saved is None or scheduler is None or not hasattr(scheduler, "state_dict"):
        return saved
    return {**scheduler.state_dict(), **saved}


def _scaler_state(saved: dict[str, Any], engine: CheckpointView) -> dict[str, Any]:
    """An fp16 engine continues from DeepSpeed's loss scale; bf16 and fp32 engines keep their unit scale."""
    state = asdict(engine.scaler)
    if engine.precision.name != "fp16" or "cur_scale" not in saved:
        return state
    return {**state, "scale": float(saved["cur_scale"]), "iteration": int(saved.get("cur_iter", 0)),
            "last_overflow_iter": int(saved.get("last_overflow_iter", -1)),
            "hysteresis_left": int(saved.get("cur_hysteresis", state["hysteresis_left"]))}


def _engine_state(ds: DeepSpeedState, engine: CheckpointView) -> dict[str, Any]:
    saved = ds.model_state
    steps = int(saved.get("global_steps", 0))
    return {
        "counters": {"global_steps": steps, "micro_steps": steps * engine.gradient_accumulation_steps(),
                     "skipped_steps": int(saved.get("skipped_steps", 0)),
                     "global_samples": int(saved.get("global_samples", steps * engine.train_batch_size()))},
        "scaler": _scaler_state(ds.loss_scaler, engine),
        "scheduler": _scheduler_state(saved.get("lr_scheduler"), engine.lr_scheduler),
        "param_groups": [{k: v for k, v in g.items() if k not in _IMPLEMENTATION_FLAGS} for g in ds.hyper],
        "rng": small_state.capture_rng(),  # restoring it is a no-op: DeepSpeed saves no RNG
        "data": None,
    }


def as_zerorun(ds: DeepSpeedState, engine: CheckpointView) -> tuple[Manifest, dict[str, Any]]:
    """The manifest and the single rank file of a world-1 zerorun checkpoint equal to ``ds``."""
    buckets = tuple(_bucket(shapes, i) for i, shapes in enumerate(ds.groups))
    manifest = Manifest(world_size=1, stage=ds.stage, dtype="fp32", zerorun_version=__version__, buckets=buckets,
                        global_steps=int(ds.model_state.get("global_steps", 0)), aliases=ds.aliases,
                        optimizer="deepspeed")
    payload = {"rank": 0, "buckets": [_bucket_payload(ds, b) for b in buckets],
               "engine": _engine_state(ds, engine), "client_state": ds.client_state()}
    return manifest, payload
