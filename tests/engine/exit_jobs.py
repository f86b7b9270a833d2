"""The rank scripts of the exit stress test (:mod:`exit_rounds`): each trains a tiny world-2 job and
ends the way its ``ending`` says, then returns, and the interpreter exits as after any script.

Importing this module is the fork server's preload: torch, ``torch._dynamo`` (imported by an
optimizer's first step: ~5 s of CPU a process), torch.distributed and the engine, once, so a rank
forked afterwards starts warm. Nothing here runs a tensor operation at import (that would start
torch's intra-op threads in the server).

A job takes the run's spec (:class:`exit_rounds.Run` as a dict) and its rank. Systems: ``ddp``
(plain torch DDP, the benchmark's reference run, always on the script's own group; it waits for
gloo's workers to go idle before it destroys its group, :func:`zerorun.engine.teardown.quiesce`:
torch's reducer frees the group with the GIL held, which deadlocked with a worker still freeing its
last work in 3 of 12 runs here, a torch bug this test is not about),
``z1``/``z2``/``z3`` (zerorun at that stage, a default config, on zerorun's group or, with
``user_group``, on one the script created), and ``readme`` (the README's main job,
``examples/train_toy.py --config templates/zero2.yaml``, as its script runs). Endings after the last
step: ``nothing`` (the engine's exit path and the interpreter do the rest), ``destroy``
(``engine.destroy()``), ``group`` (the script calls ``dist.destroy_process_group()``, whoever created
the group), ``abort`` (rank 1 calls ``os.abort()``: the failure the checker must report). A group the
script created is destroyed by the script at its end, as torch's documentation asks, unless
``keep_group`` (a script outside that contract: its group is torch's to finalize; by hand only).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
import torch._dynamo  # noqa: F401  # what a rank's first optimizer step imports: once, in the server
import torch.distributed as dist
from torch import nn

import zerorun
import zerorun.config.load  # noqa: F401  # what zerorun.initialize imports, once in the server
import zerorun.engine.api  # noqa: F401
from zerorun.engine.teardown import quiesce

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples"))
import train_toy  # noqa: E402  # the README's job, imported once

STEPS_DONE = "EXIT-STEPS-DONE"
"""Printed by every rank after its last step: training completed (what a failure after it means)."""


def _user_group(spec: Mapping[str, Any]) -> bool:
    return bool(spec["user_group"]) or spec["system"] == "ddp"


def _finish(engine: Any, spec: Mapping[str, Any], rank: int) -> None:
    """The end of a script after its last step (and the benchmark's gather of its figures)."""
    print(STEPS_DONE, flush=True)
    gathered = [torch.zeros(2) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, torch.tensor([float(rank), 1.0]))  # as the benchmark's scripts end
    dist.barrier()
    if spec["ending"] == "abort" and rank == 1:
        os.abort()
    if spec["ending"] == "destroy" and engine is not None:
        engine.destroy()
    if spec["ending"] == "group" or (_user_group(spec) and not spec["keep_group"]):
        if engine is None:  # plain DDP: its reducer frees the group later, with the GIL held (see quiesce)
            quiesce()
        dist.destroy_process_group()


def tiny(spec: Mapping[str, Any], rank: int) -> None:
    """Plain DDP or zerorun at stage ``system[1]`` on a 212-parameter MLP, ``steps`` steps."""
    system, steps = str(spec["system"]), int(spec["steps"])
    torch.set_num_threads(1)
    if _user_group(spec):
        dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4))
    x, y = torch.randn(4, 8), torch.randn(4, 4)
    engine = None
    if system == "ddp":
        ddp = nn.parallel.DistributedDataParallel(model)
        opt = torch.optim.AdamW(ddp.parameters(), lr=1e-3)
        for _ in range(steps):
            nn.functional.mse_loss(ddp(x), y).backward()
            opt.step()
            opt.zero_grad()
    else:
        cfg = {"train_micro_batch_size_per_gpu": 4, "steps_per_print": steps,
               "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
               "zero_optimization": {"stage": int(system[1:])}}
        engine, _, _, _ = zerorun.initialize(model=model, model_parameters=model.parameters(), config=cfg)
        for _ in range(steps):
            engine.backward(nn.functional.mse_loss(engine(x), y))
            engine.step()
    _finish(engine, spec, rank)


def readme(spec: Mapping[str, Any], rank: int) -> None:
    """The README's main job, as its script runs it: it returns from ``main()`` (``ending`` aside)."""
    torch.set_num_threads(1)
    sys.argv = ["train_toy.py", "--config", str(ROOT / "templates/zero2.yaml"), "--steps", str(spec["steps"])]
    train_toy.main()
    print(STEPS_DONE, flush=True)
    if spec["ending"] == "abort" and rank == 1:
        os.abort()


JOBS: dict[str, Callable[[Mapping[str, Any], int], None]] = {
    "ddp": tiny, "z1": tiny, "z2": tiny, "z3": tiny, "readme": readme}
