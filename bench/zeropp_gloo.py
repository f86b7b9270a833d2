"""Stage 3 against hpZ and MiCS at world 4 on gloo: step time, and bytes per rank and step by group and link.

Four CPU ranks on this host play nodes of ``--per-node`` ranks (``LOCAL_WORLD_SIZE``, which the
engine reads for its groups); the shared-memory lane between them counts as "inside the node".
Each policy trains the benchmark job (:mod:`bench.common`: the residual MLP, AdamW) for
``--steps`` steps; the step time is the median after ``--warmup``; the bytes are the last
step's, per process group (every unit released after its forward, so backward gathers again) (the engine's own counters, ``engine.comm_stats_by_group()``: ZeRO's
convention, an all-reduce counting twice its buffer), split by where each group's ranks live
as ``zerorun estimate`` splits them (:class:`zerorun.estimate.topology.Group`).

    python bench/zeropp_gloo.py                      # plain, hpZ 2, MiCS 2, MiCS 2 hierarchical
    python bench/zeropp_gloo.py --hidden 256 --layers 8 --steps 10
    python bench/zeropp_gloo.py --ds-python /path/to/deepspeed/venv/bin/python   # + DeepSpeed's stage 3 and hpZ 2

``--ds-python``: the same job under DeepSpeed (``bench/zeropp_gloo_ds.py`` under its torchrun, hidden
256, 8 layers only), its stage 3 and hpZ 2 (its 0.19.8 refuses MiCS's keys), after zerorun's rows.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import base_parser, build_model, get_batch, loss_fn  # noqa: E402
from zerorun.estimate.topology import Group  # noqa: E402

WORLD = 4
POLICIES = {  # name: (ranks per node, zero_optimization keys)
    "stage 3": (2, {}),
    "hpZ 2": (2, {"zero_hpz_partition_size": 2}),
    "MiCS 2": (2, {"mics_shard_size": 2}),
    "MiCS 2 hierarchical": (1, {"mics_shard_size": 2, "mics_hierarchical_params_gather": True}),
}
COUNTED = {"all_gather": 1, "reduce_scatter": 1, "all_reduce": 2, "broadcast": 1}  # bytes as counted


def _links(engine, per_node: int, delta: dict[str, dict[str, int]]) -> dict[str, tuple[int, int]]:
    """Per group, the (inside, across) bytes of ``delta`` (that group's counted bytes per kind)."""
    out = {}
    groups = engine.parts.groups
    rank = engine.ctx.rank
    for name, coll in groups.by_name().items():
        ranks = coll._world_ranks  # the group's members by world rank
        on_node = sum(r // per_node == rank // per_node for r in ranks)
        total = sum(delta[name][k] * COUNTED[k] for k in delta[name])
        link = Group(len(ranks), on_node).split(total)
        out[name] = (link.inside, link.across)
    return out


def _rank(rank: int, init_file: str, args: argparse.Namespace, results) -> None:
    os.environ.update({"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(WORLD)})
    torch.set_num_threads(args.threads or 1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD,
                            timeout=timedelta(seconds=300))
    import zerorun

    rows = {}
    for name, (per_node, keys) in POLICIES.items():
        os.environ["LOCAL_WORLD_SIZE"] = str(per_node)
        cfg = {"train_micro_batch_size_per_gpu": args.global_batch // WORLD, "steps_per_print": 10**6,
               "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.01}},
               # reuse distance 0: every unit is released after its forward and gathered again for its
               # backward (the default keeps a model this small gathered, and backward gathers nothing)
               "zero_optimization": {"stage": 3, "stage3_max_reuse_distance": 0, **keys}}
        model = build_model(args)
        engine, _, _, _ = zerorun.initialize(model=model, config=cfg)
        times, before = [], None
        for step in range(args.steps):
            x, y = get_batch(args, step, rank, WORLD)
            before = {g: {k: int(v["bytes"]) for k, v in c.items()} for g, c in engine.comm_stats_by_group().items()}
            dist.barrier()
            start = time.perf_counter()
            loss = loss_fn(engine(x), y)
            engine.backward(loss)
            engine.step()
            times.append(time.perf_counter() - start)
        after = {g: {k: int(v["bytes"]) for k, v in c.items()} for g, c in engine.comm_stats_by_group().items()}
        delta = {g: {k: after[g][k] - before[g][k] for k in after[g]} for g in after}
        rows[name] = {"step_s": statistics.median(times[args.warmup:]), "loss": float(loss.detach()),
                      "links": _links(engine, per_node, delta)}
        del engine
    results.put((rank, rows))
    dist.destroy_process_group()


def deepspeed_rows(python: str) -> list[dict]:
    """DeepSpeed's stage 3 and hpZ 2 on the same job, each in its own torchrun."""
    rows = []
    script = Path(__file__).resolve().parent / "zeropp_gloo_ds.py"
    env = {**os.environ, "DS_ACCELERATOR": "cpu"}
    for keys in ({}, {"zero_hpz_partition_size": 2}):
        out = subprocess.run([python, "-m", "torch.distributed.run", "--nproc_per_node", str(WORLD),
                              "--master_port", "29747", str(script), json.dumps(keys)],
                             capture_output=True, text=True, env=env, timeout=900)
        line = next((ln for ln in out.stdout.splitlines() if ln.startswith("BENCH_RESULT ")), None)
        if line is None:
            raise SystemExit(f"DeepSpeed {keys} failed:\n{out.stdout[-2000:]}\n{out.stderr[-4000:]}")
        rows.append(json.loads(line.split(" ", 1)[1]))
    return rows


def main() -> None:
    p = base_parser(__doc__.splitlines()[0])
    p.set_defaults(hidden=256, layers=8, steps=10, warmup=3, global_batch=64, threads=1)
    p.add_argument("--ds-python", default=None, help="a python with DeepSpeed: its stage 3 and hpZ 2 rows too")
    args = p.parse_args()
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        procs = [ctx.Process(target=_rank, args=(r, os.path.join(tmp, "rdv"), args, results)) for r in range(WORLD)]
        for proc in procs:
            proc.start()
        got = dict(results.get(timeout=1800) for _ in procs)
        for proc in procs:
            proc.join(timeout=30)
    print(f"world {WORLD} on gloo, hidden {args.hidden}, {args.layers} layers, global batch {args.global_batch}, "
          f"{args.threads} thread(s) per rank; bytes per rank and step (MiB), rank 0")
    print("| policy | step (s, median of ranks) | last loss | group: inside / across (MiB) | inside | across |")
    print("|---|---:|---:|---|---:|---:|")
    for name in POLICIES:
        r0 = got[0][name]
        step = statistics.median(got[r][name]["step_s"] for r in got)
        groups = ", ".join(f"{g} {i / 2**20:.2f} / {a / 2**20:.2f}" for g, (i, a) in r0["links"].items() if i + a)
        inside = sum(i for i, _ in r0["links"].values()) / 2**20
        across = sum(a for _, a in r0["links"].values()) / 2**20
        print(f"| {name} | {step:.3f} | {r0['loss']:.8f} | {groups} | {inside:.2f} | {across:.2f} |")
    if args.ds_python:
        for row in deepspeed_rows(args.ds_python):
            name = "DeepSpeed hpZ 2" if row["keys"] else "DeepSpeed stage 3"
            print(f"| {name} | {row['step_s']:.3f} | {row['loss']:.8f} | (not counted) | | |")


if __name__ == "__main__":
    main()
