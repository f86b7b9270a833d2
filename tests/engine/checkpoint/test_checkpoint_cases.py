"""Shared cases and rank functions for the checkpoint tests (no tests here; imported by spawned ranks).

Every world size trains the same global batch of ``ROWS`` rows per step (micro batch
``ROWS / world``), so a run resumed at another world size continues the same training.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from tests.engine.test_engine_cases import global_batch, loss_fn, make_model

ROWS = 8
STEPS = 6  # straight run; the resumed run saves after HALF
HALF = 3


@dataclass(frozen=True)
class Case:
    stage: int
    dtype: str = "fp32"  # "fp32" | "fp16"
    overlap: bool = False

    @property
    def name(self) -> str:
        return f"stage{self.stage}-{self.dtype}"

    def config(self, world: int, stage: int | None = None, offload: dict | None = None) -> dict[str, Any]:
        zero: dict[str, Any] = {"stage": self.stage if stage is None else stage, "reduce_bucket_size": 60,
                                "overlap_comm": self.overlap}
        if offload:
            zero["offload_optimizer"] = offload
        cfg: dict[str, Any] = {
            "train_micro_batch_size_per_gpu": ROWS // world,
            "gradient_accumulation_steps": 1,
            "steps_per_print": 10**6,
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.01}},
            "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0.0, "warmup_max_lr": 1e-2,
                                                         "warmup_num_steps": 4, "warmup_type": "linear"}},
            "zero_optimization": zero,
        }
        if self.dtype == "fp16":  # a short window so the scale changes within the run
            cfg["fp16"] = {"enabled": True, "initial_scale_power": 4, "loss_scale_window": 2}
        return cfg


CASES = [Case(0), Case(1, overlap=True), Case(2), Case(3), Case(2, "fp16", overlap=True)]
NEXT_STAGE = {0: 1, 1: 2, 2: 3, 3: 1}  # each checkpoint is also loaded into an engine of this stage


def build(case: Case, world: int, stage: int | None = None, seed: int = 1234) -> Any:
    import zerorun

    engine, _, _, _ = zerorun.initialize(model=make_model(seed), config=case.config(world, stage))
    return engine


def train(engine: Any, rank: int, world: int, first: int, steps: int) -> list[float]:
    rows = ROWS // world
    losses = []
    for step in range(first, first + steps):
        x, y = global_batch(step, ROWS)
        sl = slice(rank * rows, (rank + 1) * rows)
        loss = loss_fn(engine(x[sl].to(engine.precision.compute_dtype)), y[sl])
        engine.backward(loss)
        engine.step()
        losses.append(float(loss.detach()))
    return losses


def snapshot(engine: Any) -> dict[str, Any]:
    from zerorun.zero import GatheredParameters

    with GatheredParameters(list(engine.module.parameters())):  # stage 3: whole parameters to compare
        params = {n: p.detach().float().clone() for n, p in engine.module.named_parameters()}
    return {
        "params": params,
        "loss_scale": engine.loss_scale,
        "scaler": engine.scaler,
        "lr": engine.get_lr(),
        "global_steps": engine.global_steps,
        "skipped": engine.skipped_steps,
    }


def save_phase(rank: int, world: int, root: str) -> dict[str, Any]:
    """World 2: a straight run of STEPS that saves to ``root/<case>`` after HALF steps (saving changes nothing)."""
    out = {}
    for case in CASES:
        engine = build(case, world)
        train(engine, rank, world, 0, HALF)
        engine.save_checkpoint(str(Path(root) / case.name), client_state={"case": case.name, "rank": rank})
        half, rng = snapshot(engine), torch.rand(4)
        train(engine, rank, world, HALF, STEPS - HALF)
        out[case.name] = {"straight": snapshot(engine), "half": half, "rng_after_save": rng}
    return out


def reshard_phase(rank: int, world: int, root: str) -> dict[str, Any]:
    """World 4: load each world-2 checkpoint (also into the next stage), continue HALF steps, save."""
    out = {}
    for case in CASES:
        loaded = {}
        for stage in (case.stage, NEXT_STAGE[case.stage]):
            engine = build(case, world, stage=stage, seed=99)  # other initial weights: the load must replace them
            _, client = engine.load_checkpoint(str(Path(root) / case.name))
            loaded[stage] = snapshot(engine)
            loaded[stage]["client"] = client
        train(engine, rank, world, HALF, STEPS - HALF)  # continue in the last (other-stage) engine
        engine.save_checkpoint(str(Path(root) / f"{case.name}-w4"), tag="end")
        out[case.name] = {"loaded": loaded, "end": snapshot(engine)}
    return out


def resume_phase(rank: int, world: int, root: str) -> dict[str, Any]:
    """World 2 again, fresh processes: resume each checkpoint and finish; load the world-4 one too."""
    out = {}
    for case in CASES:
        engine = build(case, world, seed=7)
        path, client = engine.load_checkpoint(str(Path(root) / case.name), load_rng_state=True)
        rng = torch.rand(4)
        at_load = snapshot(engine)
        train(engine, rank, world, HALF, STEPS - HALF)
        back = build(case, world, seed=8)
        back.load_checkpoint(str(Path(root) / f"{case.name}-w4"), tag="end")
        out[case.name] = {"path": path, "client": client, "rng_after_load": rng, "at_load": at_load,
                          "end": snapshot(engine), "from_w4": snapshot(back)}
    return out
