"""Where a compiled step's time goes: forward, backward (with its reductions), optimizer step, eager vs compiled.

    OMP_NUM_THREADS=1 PYTHONPATH=. python -m torch.distributed.run --standalone --nproc_per_node 2 \\
        bench/compile_phases.py --stages 2,3 --steps 12 [--profile]

The model, data and optimizer of ``bench/compile.py``. For each stage an eager and a compiled zerorun
engine (``engine.compile(backend=)``) are built; after two warm-up steps alone, step s of every arm runs
before step s+1 of any (interleaved, so load on a shared machine hits all alike). Each phase is timed
on every rank between barriers (the slowest rank's time counts), median over the steps:

* ``forward``: ``engine(tokens)`` and the loss;
* ``backward``: ``engine.backward(loss)``: autograd, the gradient hooks' reductions and their waits;
* ``step``: ``engine.step()``: the gradient norm, the optimizer over the rank's shard, the write-back and
  (stages 1-2) the parameters' all-gather.

``--fused``: every arm again with ``torch.optim.AdamW(fused=True)`` (the step phase's share of the optimizer).
``--profile``: one more step per arm under ``torch.profiler`` on rank 0; its top operators (self CPU time)
are printed, so what compile removed (or did not) can be named. Rank 0 prints a table and one
``BENCH_PHASES`` JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.compile import BETAS, EPS, LR, WD, adamw, add_model_args, build, engine_config, loss_of, tokens_for  # noqa: E402

PHASES = ("forward", "backward", "step")


def slowest(seconds: float) -> float:
    t = torch.tensor([seconds])
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t)


def phased_step(engine: object, tokens: torch.Tensor) -> dict[str, float]:
    """One training step, each phase timed between barriers (the slowest rank's seconds), and its loss."""
    out: dict[str, float] = {}
    calls: list[tuple[str, Callable[[], object]]] = [
        ("forward", lambda: out.__setitem__("_loss", loss_of(engine, tokens))),  # type: ignore[arg-type]
        ("backward", lambda: engine.backward(out["_loss"])),  # type: ignore[attr-defined]
        ("step", lambda: engine.step()),  # type: ignore[attr-defined]
    ]
    for name, call in calls:
        dist.barrier()
        t0 = time.perf_counter()
        call()
        out[name] = slowest(time.perf_counter() - t0)
    out["loss"] = float(out.pop("_loss").detach())  # type: ignore[union-attr]
    return out


def make_engine(a: argparse.Namespace, stage: int, compiled: bool, fused: bool = False) -> object:
    import zerorun

    model = build(a)
    opt = (torch.optim.AdamW(model.parameters(), lr=LR, betas=BETAS, eps=EPS, weight_decay=WD, fused=True)
           if fused else adamw(model.parameters()))
    engine, _, _, _ = zerorun.initialize(model=model, optimizer=opt, config=engine_config(a, stage))
    if compiled:
        engine.compile(backend=a.backend)
    return engine


def profile_table(engine: object, tokens: torch.Tensor, rows: int, shapes: bool) -> str:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], record_shapes=shapes) as prof:
        phased_step(engine, tokens)
    averages = prof.key_averages(group_by_input_shape=shapes)
    return averages.table(sort_by="self_cpu_time_total", row_limit=rows, max_name_column_width=60,
                          max_shapes_column_width=70)


def run(a: argparse.Namespace) -> tuple[dict[str, dict], dict[str, str]]:
    import torch._dynamo

    torch._dynamo.config.cache_size_limit = 64
    rank, world = dist.get_rank(), dist.get_world_size()
    arms = [(f"z{s}{'+compile' if c else ''}", int(s), c) for s in a.stages.split(",") for c in (False, True)]
    if a.fused:  # the same arms with torch's fused AdamW (one pass over each flat shard)
        arms += [(f"{n}+fused", s, c) for n, s, c in arms]
    engines = {}
    for name, stage, compiled in arms:
        engines[name] = make_engine(a, stage, compiled, name.endswith("+fused"))
        for k in range(2):
            phased_step(engines[name], tokens_for(a, k, rank, world))
    out: dict[str, dict] = {name: {p: [] for p in (*PHASES, "loss")} for name, _, _ in arms}
    for k in range(2, a.steps):
        for name, _, _ in arms:
            for p, v in phased_step(engines[name], tokens_for(a, k, rank, world)).items():
                out[name][p].append(v)
    tables = {}
    if a.profile:
        for name, _, _ in arms:
            table = profile_table(engines[name], tokens_for(a, a.steps, rank, world), a.profile_rows, a.shapes)
            tables[name] = table
    return out, tables


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--stages", default="2,3")
    p.add_argument("--steps", type=int, default=12)
    add_model_args(p)
    p.add_argument("--fused", action="store_true", help="also each arm with AdamW(fused=True)")
    p.add_argument("--profile", action="store_true")
    p.add_argument("--profile-rows", type=int, default=25)
    p.add_argument("--shapes", action="store_true", help="the profile's operators grouped by input shapes")
    a = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    out, tables = run(a)
    if dist.get_rank() == 0:
        med = {n: {k: statistics.median(v) * (1 if k == "loss" else 1e3) for k, v in r.items()} for n, r in out.items()}
        print(f"{'arm':<12} " + " ".join(f"{p + ' ms':>12}" for p in (*PHASES, "total")))
        for n, m in med.items():
            total = sum(m[p] for p in PHASES)
            print(f"{n:<12} " + " ".join(f"{m[p]:12.1f}" for p in PHASES) + f" {total:12.1f}")
        for n, t in tables.items():
            print(f"--- {n}: top operators by self CPU time, one step on rank 0\n{t}")
        print("BENCH_PHASES " + json.dumps({"args": vars(a), "median_ms": med, "raw": out}), flush=True)
    dist.destroy_process_group()
    os._exit(0)


if __name__ == "__main__":
    main()
