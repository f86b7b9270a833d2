"""The engine's small state: step counters, loss scaler, scheduler, optimizer hyper-parameters, RNG.

Saved in every rank file (RNG streams differ per rank). Loading at a new world size,
rank ``r`` takes the RNG states of saved rank ``r mod N``.
"""

from __future__ import annotations

import random
import sys
from dataclasses import asdict
from typing import Any

import torch

from zerorun.engine import loss_scaler


def capture_rng() -> dict[str, Any]:
    rng: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if "numpy" in sys.modules:
        rng["numpy"] = sys.modules["numpy"].random.get_state()
    if torch.cuda.is_available():
        rng["cuda"] = torch.cuda.get_rng_state_all()
    return rng


def restore_rng(rng: dict[str, Any]) -> None:
    torch.set_rng_state(rng["torch"])
    random.setstate(rng["python"])
    if "numpy" in rng:
        import numpy as np

        np.random.set_state(rng["numpy"])
    if "cuda" in rng and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])


def capture(engine: Any) -> dict[str, Any]:
    sched = engine.lr_scheduler
    return {
        "counters": {"global_steps": engine.global_steps, "micro_steps": engine.micro_steps,
                     "skipped_steps": engine.skipped_steps},
        "scaler": asdict(engine.scaler),
        "scheduler": sched.state_dict() if sched is not None and hasattr(sched, "state_dict") else None,
        "param_groups": [{k: v for k, v in g.items() if k != "params"} for g in engine.optimizer.param_groups],
        "rng": capture_rng(),
    }


def restore(engine: Any, saved: dict[str, Any], optimizer_states: bool, scheduler_states: bool,
            rng_state: bool = False) -> None:
    counters = saved["counters"]
    engine.global_steps = counters["global_steps"]
    engine.micro_steps = counters["micro_steps"]
    engine.skipped_steps = counters["skipped_steps"]
    engine.scaler = loss_scaler.ScalerState(**saved["scaler"])
    if optimizer_states:
        for group, hyper in zip(engine.optimizer.param_groups, saved["param_groups"], strict=False):
            group.update(hyper)
    sched = engine.lr_scheduler
    if scheduler_states and sched is not None and saved["scheduler"] is not None:
        sched.load_state_dict(saved["scheduler"])
    if rng_state:
        restore_rng(saved["rng"])
