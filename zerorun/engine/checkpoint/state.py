"""The engine's small state: step counters, loss scaler, scheduler, optimizer hyper-parameters, RNG,
and the data position of ``engine.training_dataloader``.

Saved in every rank file (RNG streams differ per rank). Loading at a new world size,
rank ``r`` takes the RNG states of saved rank ``r mod N``; the data position is global
(samples read in the epoch), so every rank's copy is the same.
"""

from __future__ import annotations

import random
import sys
import warnings
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

import torch

from zerorun.engine.checkpoint.resume_note import batch_facts
from zerorun.engine.numerics import loss_scaler

if TYPE_CHECKING:
    from zerorun.engine.views import Counters


def capture_rng() -> dict[str, Any]:
    rng: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if "numpy" in sys.modules:  # plain data (no ndarray), so the rank file loads with weights_only
        name, keys, pos, has_gauss, cached = sys.modules["numpy"].random.get_state()
        rng["numpy"] = (str(name), [int(k) for k in keys], int(pos), int(has_gauss), float(cached))
    if torch.cuda.is_available():
        rng["cuda"] = torch.cuda.get_rng_state_all()
    return rng


def restore_rng(rng: dict[str, Any]) -> None:
    torch.set_rng_state(rng["torch"])
    random.setstate(rng["python"])
    if "numpy" in rng:
        import numpy as np

        name, keys, pos, has_gauss, cached = rng["numpy"]
        np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    if "cuda" in rng and torch.cuda.is_available():
        restore_cuda_rng(rng["cuda"])


def restore_cuda_rng(states: list[torch.Tensor]) -> None:
    """Each visible GPU takes the saved state of the same index; counts that differ warn once.

    A job resumed on another allocation may see more or fewer GPUs per process than the one
    that saved (one per rank under srun, all of the node's under zerorun's launcher): the
    devices both runs have are restored, the others keep their seeds.
    """
    visible = torch.cuda.device_count()
    if len(states) != visible:
        warnings.warn(f"the checkpoint holds CUDA RNG states of {len(states)} device(s) but this process sees "
                      f"{visible}: restoring the first {min(len(states), visible)}, the others keep their seeds",
                      RuntimeWarning, stacklevel=3)
    for index, state in enumerate(states[:visible]):
        torch.cuda.set_rng_state(state, index)


def capture(engine: Counters) -> dict[str, Any]:
    sched = engine.lr_scheduler
    return {
        "counters": {"global_steps": engine.global_steps, "micro_steps": engine.micro_steps,
                     "skipped_steps": engine.skipped_steps, "global_samples": engine.global_samples},
        "scaler": asdict(engine.scaler),
        "scheduler": sched.state_dict() if sched is not None and hasattr(sched, "state_dict") else None,
        "param_groups": [{k: v for k, v in g.items() if k != "params"} for g in engine.optimizer.param_groups],
        "rng": capture_rng(),
        "data": _loader_state(engine),
        "batch": batch_facts(engine),  # the next load says what changed (resume_note.py)
    }


def _loader_state(engine: Counters) -> dict[str, Any] | None:
    loader = getattr(engine, "training_dataloader", None)
    return loader.state_dict() if loader is not None and hasattr(loader, "state_dict") else None


def rebased_micro_steps(counters: dict[str, Any], batch: dict[str, Any], accumulation: int) -> int:
    """The micro-step count re-based to this run's accumulation (an elastic resume changes it).

    The accumulation boundary is ``micro_steps % accumulation``: the saved count at another
    accumulation would put the boundary mid-way (2 steps x 2 = 4 micro steps, at 3 per step: a
    step after 2 micro batches). Micro batches past the saved boundary are carried over as such.
    """
    saved_gas = batch.get("gradient_accumulation_steps", accumulation)
    if saved_gas == accumulation:
        return int(counters["micro_steps"])
    steps = int(counters["global_steps"])
    return steps * accumulation + max(0, int(counters["micro_steps"]) - steps * int(saved_gas))


def restore(engine: Counters, saved: dict[str, Any], optimizer_states: bool, scheduler_states: bool,
            rng_state: bool = False) -> None:
    counters = saved["counters"]
    engine.global_steps = counters["global_steps"]
    engine.micro_steps = rebased_micro_steps(counters, saved.get("batch") or {}, engine.gradient_accumulation_steps())
    engine.skipped_steps = counters["skipped_steps"]
    # a checkpoint from before global_samples: DeepSpeed's fallback (steps x today's global batch)
    engine.global_samples = counters.get("global_samples", engine.global_steps * engine.train_batch_size())
    engine.scaler = loss_scaler.ScalerState(**saved["scaler"])
    if optimizer_states:
        for group, hyper in zip(engine.optimizer.param_groups, saved["param_groups"], strict=False):
            group.update(hyper)
    sched = engine.lr_scheduler
    if scheduler_states and sched is not None and saved["scheduler"] is not None:
        sched.load_state_dict(saved["scheduler"])
    if rng_state:  # DeepSpeed never restores the global RNG; only when asked
        restore_rng(saved["rng"])
    loader = getattr(engine, "training_dataloader", None)
    if saved.get("data") is not None and loader is not None and hasattr(loader, "load_state_dict"):
        loader.load_state_dict(saved["data"])

