"""The engine's side of a trial, in the two calls the engine makes.

    source = trial_config(source)        # in initialize(): the trial's knobs over the user's config
    self._trial = recorder_for(self)     # in Engine.__init__; after each optimizer step:
    if self._trial is not None: self._trial.step_done()

Outside a trial (no ``ZERORUN_TRIAL_*`` variables) both are no-ops: the source comes
back unchanged and the recorder is None.

The result's ``facts`` tell the tuner what it cannot see from outside: the model's
hidden size (``config.hidden_size`` when the model has one, else the most common
``in_features`` of its ``nn.Linear`` layers, ties to the smaller), its parameter
count, the world size and what ``peak_bytes`` measured (``cuda_max_allocated`` on a
GPU, else ``model_state``: the engine's memory breakdown total), and for ``estimate
--measure`` every rank's physical figures (peaks counted from the end of warm-up) and the
largest bucket and parameter (the in-flight terms' sizes).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from zerorun.engine.mechanism.buckets import MAX_BUCKET_NUMEL
from zerorun.trial.protocol import (
    TrialRecorder,
    TrialSpec,
    apply_overrides,
    memory_cap,
    read_trial_overrides,
)

if TYPE_CHECKING:
    from zerorun.engine.views import TrialView


def trial_config(source: str | Path | dict[str, Any]) -> str | Path | dict[str, Any]:
    """``source`` itself outside a trial; inside one, its dict with the trial's knobs merged in."""
    overrides = read_trial_overrides()
    if overrides is None:
        return source
    from zerorun.config.read import read_source

    data, _ = read_source(source)
    return apply_overrides(data, overrides)


def guess_hidden_size(model: nn.Module) -> int | None:
    """``model.config.hidden_size``, else the most common ``nn.Linear`` input width."""
    value = getattr(getattr(model, "config", None), "hidden_size", None)
    if isinstance(value, int) and value > 0:
        return value
    widths = Counter(m.in_features for m in model.modules() if isinstance(m, nn.Linear))
    if not widths:
        dims = [m.embedding_dim for m in model.modules() if isinstance(m, nn.Embedding)]
        return min(dims) if dims else None
    top = max(widths.values())
    return min(w for w, n in widths.items() if n == top)


def _model_state_bytes(engine: TrialView) -> int:
    from zerorun.engine.metrics import model_state_bytes  # the bookkeeping keys, not the physical ones

    return model_state_bytes(engine.memory_breakdown())


def measured_facts(engine: TrialView) -> dict[str, Any]:
    """What ``zerorun estimate --measure`` compares: the memory held after the steps, and the
    config the engine really ran (stage, precision, optimizer, bucket knobs)."""
    cfg = engine.config
    zero = cfg.zero_optimization
    optimizer = type(engine.optimizer).__name__.lower()
    if optimizer == "sgd":
        optimizer = "sgd" if engine.optimizer.defaults.get("momentum") else "sgd-nomomentum"
    knobs = ("reduce_bucket_size", "allgather_bucket_size", "overlap_comm", "stage3_prefetch_bucket_size",
             "stage3_max_live_parameters", "stage3_param_persistence_threshold")
    return {
        "memory_breakdown": dict(engine.memory_breakdown()),
        "dtype": "bf16" if cfg.bf16.enabled else "fp16" if cfg.fp16.enabled else "fp32",
        "optimizer": optimizer,
        "buckets": {**{k: getattr(zero, k) for k in knobs if hasattr(zero, k)},
                    "layout_cap": None if engine.coll.native_reduce_scatter else MAX_BUCKET_NUMEL},
        "largest_bucket": max((b.plan.padded_numel for b in engine.parts.buckets), default=0),
        "shared_memory_lane": engine.coll.lane is not None,
        "largest_param": max((s.numel for b in engine.parts.buckets for s in b.plan.slots), default=0),
        "offload_optimizer": str(getattr(zero.offload_optimizer.device, "value", zero.offload_optimizer.device)),
        "offload_param": str(getattr(zero.offload_param.device, "value", zero.offload_param.device)),
        # glibc's tunables: fixed thresholds change what the allocator keeps (estimate.measure.allocator_retention)
        "allocator_env": {k: v for k, v in os.environ.items() if k in ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_")},
    }


def _leave(code: int) -> None:
    """End a trial process: every rank at the barrier, then the process group torn down.

    Exiting with a live gloo group can abort in its threads' destructors ("terminate
    called without an active exception", SIGABRT), which would turn a finished trial
    into a crash.
    """
    from zerorun.engine.comm.script import leave_group

    with contextlib.suppress(Exception):
        leave_group()
    sys.exit(code)


def recorder_for(engine: TrialView) -> TrialRecorder | None:
    """A recorder wired to ``engine`` when this process is a trial, else None."""
    spec = TrialSpec.from_env()
    if spec is None:
        return None
    device: torch.device = engine.device
    on_gpu = device.type == "cuda"

    def peak() -> int:
        return int(torch.cuda.max_memory_allocated(device)) if on_gpu else _model_state_bytes(engine)

    facts = {
        "hidden_size": guess_hidden_size(engine.module),
        "num_parameters": int(engine.num_parameters()),
        "world_size": int(engine.ctx.world_size),
        "stage": int(engine.zero_stage),
        "peak_kind": "cuda_max_allocated" if on_gpu else "model_state",
    }
    recorder = EngineTrial(
        engine, spec, rank=engine.ctx.rank, samples_per_step=engine.train_batch_size(), peak_bytes=peak,
        facts=facts, held_bytes=lambda: _model_state_bytes(engine), memory_cap=memory_cap(),
        late_facts=lambda: {**measured_facts(engine), "physical_per_rank": recorder.physical_per_rank}, exit=_leave,
    )
    recorder.install_excepthook()
    return recorder


class EngineTrial(TrialRecorder):
    """A trial of a zerorun engine: the physical peak counts from the end of warm-up (set-up and the
    first step's one-off allocations left out), and every rank's physical figures reach rank 0."""

    def __init__(self, engine: TrialView, spec: TrialSpec, **kwargs: Any) -> None:
        super().__init__(spec, **kwargs)
        self.engine = engine
        self.physical_per_rank: list[dict[str, int]] = []

    def step_done(self) -> bool:
        if self.steps_done + 1 == self.spec.warmup:  # this step ends the warm-up
            self.engine.reset_memory_peak()
        return super().step_done()

    def finish(self) -> None:
        from zerorun.engine.physical_memory import physical_figures

        mine = physical_figures(self.engine.device)
        # every rank calls finish: one gather, rank 0 writes
        self.physical_per_rank = self.engine.coll.all_gather_object(mine)
        super().finish()
