"""``python bench/checkpoint.py --decoupled``: how long saves block training, synchronous vs decoupled.

See bench/checkpoint.py's docstring for the protocol. Prints one JSON line (rank 0's
figures; every rank's blocking times are maxed per save, as training waits for the slowest).
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from offload import toy  # bench/offload.py, beside this file

MODES = {"sync": {}, "decoupled": {"decoupled": True}}


def _engine(hidden: int, layers: int, stage: int, world: int, writer: dict[str, Any]) -> Any:
    import zerorun

    torch.manual_seed(0)
    cfg = {"train_micro_batch_size_per_gpu": 16 // world, "steps_per_print": 10**6,
           "zero_optimization": {"stage": stage, "reduce_bucket_size": 2**22},
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}}, "checkpoint": {"writer": writer}}
    engine, _, _, _ = zerorun.initialize(model=toy(hidden, layers), config=cfg)
    return engine


def _step(engine: Any, hidden: int, step: int, rank: int, world: int) -> None:
    x = torch.randn(16, hidden, generator=torch.Generator().manual_seed(step))
    rows = 16 // world
    engine.backward(engine(x[rank * rows:(rank + 1) * rows]).square().mean())
    engine.step()


def _max(value: float) -> float:
    t = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def _state(engine: Any) -> list[torch.Tensor]:
    out = []
    for m in engine.parts.masters.masters:
        out.append(m.detach().clone())
        out += [v.clone() for _, v in sorted(engine.optimizer.state.get(m, {}).items()) if torch.is_tensor(v)]
    return out


def _rank(rank: int, world: int, root: str, hidden: int, layers: int, stage: int, saves: int, after: int) -> None:
    from zerorun.engine.checkpoint.decoupled import settle

    os.environ.update({"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world)})
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{root}/rdv", rank=rank, world_size=world,
                            timeout=timedelta(seconds=600))
    engines = {name: _engine(hidden, layers, stage, world, w) for name, w in MODES.items()}
    fig: dict[str, dict[str, list[float]]] = {n: {"save": [], "after": [], "drain": []} for n in engines}
    step, at_save = 0, {}
    for i in range(saves):
        for name, engine in engines.items():
            _step(engine, hidden, step, rank, world)
            if i == saves - 1:
                at_save[name] = _state(engine)  # training goes on after the save: compare to this
            dist.barrier()
            t0 = time.perf_counter()
            engine.save_checkpoint(f"{root}/{name}", tag=f"s{i}")
            fig[name]["save"].append(_max(time.perf_counter() - t0))
            t0 = time.perf_counter()
            for k in range(after):
                _step(engine, hidden, step + 1 + k, rank, world)
            fig[name]["after"].append(_max(time.perf_counter() - t0) / max(after, 1))
            t0 = time.perf_counter()
            settle(engine)  # the write still under way (none for sync), outside the blocking time
            fig[name]["drain"].append(_max(time.perf_counter() - t0))
        step += 1 + after
    identical = {}
    for name in engines:
        fresh = _engine(hidden, layers, stage, world, {})
        path, _ = fresh.load_checkpoint(f"{root}/{name}")
        same = Path(path).name == f"s{saves - 1}" and all(
            torch.equal(a, b) for a, b in zip(_state(fresh), at_save[name], strict=True))
        identical[name] = bool(_max(0.0 if same else 1.0) == 0.0)
    twins = all(torch.equal(a, b) for a, b in zip(at_save["sync"], at_save["decoupled"], strict=True))
    if rank == 0:
        params = engines["sync"].num_parameters()
        total = {n: sum(f["save"]) for n, f in fig.items()}
        print(json.dumps({
            "params": params, "world": world, "stage": stage, "saves": saves,
            "blocking_s": {n: [round(v, 3) for v in f["save"]] for n, f in fig.items()},
            "blocking_total_s": {n: round(v, 3) for n, v in total.items()},
            "decoupled_over_sync": round(total["decoupled"] / total["sync"], 3),
            "step_after_save_s": {n: round(statistics.mean(f["after"]), 3) for n, f in fig.items()},
            "write_left_after_steps_s": [round(v, 3) for v in fig["decoupled"]["drain"]],
            "last_tag_loads_bit_identical": identical, "sync_and_decoupled_states_equal": twins,
        }), flush=True)
    dist.destroy_process_group()


def compare(hidden: int, layers: int, stage: int, world: int, saves: int, after: int) -> None:
    with tempfile.TemporaryDirectory(prefix="zr-bench-ckpt-") as root:
        mp.start_processes(_rank, args=(world, root, hidden, layers, stage, saves, after), nprocs=world,
                           start_method="spawn")
