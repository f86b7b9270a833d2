"""Stage 3 with and without ZeRO++'s quantized collectives (qwZ, qgZ) at world 4 on gloo: step time, bytes.

One spawned group of ``--world`` CPU ranks (file rendezvous) trains the benchmark's residual
MLP (bench/common.py) under each policy in turn, ``--repeat`` rounds interleaved, so a
change in the machine's load hits every policy alike. Per policy: the median step time over
the measured steps of all rounds (rank 0; every rank waits for the others in each step's
collectives), and per step and rank the bytes each collective kind moved, as the engine's
counters hold them (the int8 values and fp32 scales that crossed, under qwZ/qgZ). All ranks
run on this host: with the shared-memory lane (the default) all-gathers and plain
reduce-scatters go through it, qgZ's all-to-all always goes point to point; ``--no-lane``
sends everything point to point (the path of ranks on different hosts).

    python bench/zeropp_quant.py                       # bf16, hidden 256, 4 layers, world 4
    python bench/zeropp_quant.py --dtype fp32 --no-lane
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import ResMLP, get_batch, loss_fn  # noqa: E402

POLICIES = {
    "stage 3": {},
    "qwZ": {"zero_quantized_weights": True},
    "qgZ": {"zero_quantized_gradients": True},
    "qwZ + qgZ": {"zero_quantized_weights": True, "zero_quantized_gradients": True},
}
KINDS = ("all_gather", "reduce_scatter", "all_reduce")


def _config(args: argparse.Namespace, extra: dict) -> dict:
    cfg = {"train_micro_batch_size_per_gpu": args.micro_batch, "steps_per_print": 10**6,
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.01}},
           "zero_optimization": {"stage": 3, **extra}}
    if args.dtype == "bf16":
        cfg["bf16"] = {"enabled": True}
    return cfg


def _one(args: argparse.Namespace, rank: int, world: int, extra: dict) -> dict:
    import zerorun

    torch.manual_seed(args.seed)
    model = ResMLP(args.hidden, args.layers)
    engine, _, _, _ = zerorun.initialize(model=model, config=_config(args, extra))
    times, losses, before = [], [], None
    for step in range(args.warmup + args.steps):
        if step == args.warmup:
            before = engine.comm_stats()
        x, y = get_batch(args, step, rank, world)
        start = time.perf_counter()
        loss = loss_fn(engine(x.to(engine.precision.compute_dtype)), y)  # the engine casts no input
        engine.backward(loss)
        engine.step()
        times.append(time.perf_counter() - start)
        losses.append(float(loss.detach()))
    after = engine.comm_stats()
    assert before is not None
    moved = {k: (after[k]["bytes"] - before[k]["bytes"]) // args.steps for k in KINDS}
    return {"times": times[args.warmup:], "bytes": moved, "loss": losses[-1],
            "via": {k: after[k].get("via", "") for k in KINDS}}


def _worker(rank: int, world: int, init_file: str, args: argparse.Namespace, out: dict) -> None:
    torch.set_num_threads(args.threads)
    os.environ.update({"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world),
                       "LOCAL_WORLD_SIZE": str(world)})
    if args.no_lane:
        os.environ["ZERORUN_SHARED_MEMORY"] = "0"
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=300))
    results: dict[str, list[dict]] = {name: [] for name in POLICIES}
    for _ in range(args.repeat):
        for name, extra in POLICIES.items():
            results[name].append(_one(args, rank, world, extra))
    if rank == 0:
        out.update(results)
    dist.destroy_process_group()


def table(results: dict[str, list[dict]], args: argparse.Namespace) -> str:
    base = None
    lines = ["| policy | step median (ms) | all-gather / step | reduce-scatter / step | all-reduce / step "
             "| all-gather vs stage 3 | last loss |", "|---|---|---|---|---|---|---|"]
    for name, runs in results.items():
        times = [t for r in runs for t in r["times"]]
        moved = runs[-1]["bytes"]
        base = base or moved
        ratio = moved["all_gather"] / base["all_gather"]
        lines.append(f"| {name} | {1e3 * statistics.median(times):.1f} | {moved['all_gather'] / 2**20:.2f} MiB "
                     f"| {moved['reduce_scatter'] / 2**20:.2f} MiB | {moved['all_reduce']} B | {ratio:.3f} "
                     f"| {runs[-1]['loss']:.5f} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--world", type=int, default=4)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--global-batch", type=int, default=None, help="default: micro batch x world")
    p.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--no-lane", action="store_true", help="no shared-memory lane: every collective point to point")
    args = p.parse_args()
    args.global_batch = args.global_batch or args.micro_batch * args.world
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory() as tmp, ctx.Manager() as manager:
        out = manager.dict()
        procs = [ctx.Process(target=_worker, args=(r, args.world, os.path.join(tmp, "rdv"), args, out))
                 for r in range(args.world)]
        for proc in procs:
            proc.start()
        for proc in procs:
            proc.join(timeout=1800)
            if proc.exitcode != 0:
                for q in procs:
                    q.kill()
                raise SystemExit(f"a rank failed (exit {proc.exitcode})")
        results = dict(out)
    n = sum(x.numel() for x in ResMLP(args.hidden, args.layers).parameters())
    print(f"ResMLP hidden {args.hidden} x {args.layers} layers ({n:,} parameters), {args.dtype}, world {args.world}, "
          f"micro batch {args.micro_batch}, {args.steps} measured steps x {args.repeat} rounds, "
          f"{'point to point' if args.no_lane else 'shared-memory lane'}")
    print(f"via: {results['qwZ + qgZ'][-1]['via']}")
    print(table(results, args))


if __name__ == "__main__":
    main()
