"""Which buffers a zerorun rank holds at its training-step peak, by owner (stage 3 by default).

    python bench/stage3_account.py                          # the memory benchmark's MLP, world 2, tight window
    python bench/stage3_account.py --window defaults        # DeepSpeed's stage-3 window defaults
    python bench/stage3_account.py --stage 2 --small        # any stage; a 2.2M-parameter model

Each rank builds bench/memory.py's model and config (hidden 1024, 12 blocks, fp32, AdamW,
micro batch 8, gloo, the shared-memory lane on), trains one warm-up step, then one step
watched by :func:`zerorun.simulate.account.step_account`: every storage reachable from the
engine, each once, filed under its owner (parameter shards, gathered window, gradient sums,
staging pool, coalescing group, masters, optimizer state, lane slots, ZeRO++ buffers,
offload), sampled as forward saves tensors, as backward unpacks them, as each gradient
leaves autograd, after backward and after the step. Rank 0 prints the sample with the most
resident bytes (``mincore``: pages the kernel holds, not address ranges), with each
owner's storage count and allocated bytes beside its resident ones. Then one more step,
unwatched, gives each phase's own ``VmHWM`` (forward, backward, step; ``malloc_trim(0)``
and a reset before each) over the import baseline: what no owner explains is activations,
the runtime (gloo, threads) and the allocator's retention within the phase.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import torch
import torch.distributed as dist

_HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(_HERE)
sys.path.insert(0, _HERE)
import common as C  # noqa: E402
from memory_facts import block_numel  # noqa: E402

MiB = 2**20
PREFIX = "STAGE3_ACCOUNT "


def _status(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def _reset_peak() -> None:
    """``VmHWM`` from now on (Linux: 5 into clear_refs); glibc's free pages handed back first."""
    import ctypes

    ctypes.CDLL("libc.so.6").malloc_trim(0)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def phase_peaks(engine: object, batch: tuple[torch.Tensor, torch.Tensor], baseline: int) -> dict[str, int]:
    """One more training step, each phase's own ``VmHWM`` over ``baseline`` (forward, backward, step)."""
    out = {}
    x, y = batch
    _reset_peak()
    loss = C.loss_fn(engine(x), y)  # type: ignore[operator]
    out["forward"] = _status("VmHWM") - baseline
    _reset_peak()
    engine.backward(loss)  # type: ignore[attr-defined]
    out["backward"] = _status("VmHWM") - baseline
    _reset_peak()
    engine.step()  # type: ignore[attr-defined]
    out["step"] = _status("VmHWM") - baseline
    out["after step (RSS)"] = _status("VmRSS") - baseline
    return out


def config(args: argparse.Namespace, world: int) -> dict:
    zero: dict = {"stage": args.stage}
    if args.stage == 3 and args.window == "tight":  # bench/memory.py's zerorun-z3: release each unit, prefetch a block
        zero.update(stage3_max_reuse_distance=0, stage3_prefetch_bucket_size=block_numel(args))
    return {"train_micro_batch_size_per_gpu": args.micro_batch, "gradient_clipping": 0.0, "steps_per_print": 10**9,
            "zero_optimization": zero}


def worker(args: argparse.Namespace) -> None:
    import zerorun
    from zerorun.simulate.account import step_account

    torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))])  # torch.optim's lazy imports, as bench/memory.py
    baseline = _status("VmRSS")
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    args.global_batch = args.micro_batch * world
    model = C.build_model(args)
    engine, *_ = zerorun.initialize(model=model, optimizer=C.make_adamw(model.parameters()), config=config(args, world))
    batches = [C.get_batch(args, s, rank, world) for s in range(3)]

    def forward_backward(x: torch.Tensor, y: torch.Tensor) -> None:
        engine.backward(C.loss_fn(engine(x), y))

    forward_backward(*batches[0])
    engine.step()
    watch = step_account(engine, model, lambda: forward_backward(*batches[1]), engine.step, every=args.every)
    peak = watch.peak
    phases = phase_peaks(engine, batches[2], baseline)
    rows = {owner: {"resident": n, "allocated": peak.by_owner(resident=False).get(owner, 0),
                    "storages": peak.count(owner)} for owner, n in peak.by_owner().items()}
    out = {"rank": rank, "world": world, "stage": args.stage, "window": args.window, "label": peak.label,
           "samples": watch.samples, "owners": rows, "accounted": peak.total(),
           "rss_over_baseline_at_end": _status("VmRSS") - baseline, "vmhwm_over_baseline": _status("VmHWM") - baseline,
           "rss_shmem": _status("RssShmem"), "phases": phases, "largest": [(h.path, h.owner, h.nbytes, h.resident) for h in
                                                         sorted(peak.held, key=lambda h: -(h.resident or 0))[:12]]}
    outs: list = [None] * world
    dist.all_gather_object(outs, out)
    if rank == 0:
        print(PREFIX + json.dumps(outs), flush=True)
    dist.barrier()
    dist.destroy_process_group()


def table(ranks: list[dict]) -> str:
    worst = max(ranks, key=lambda r: r["accounted"])
    lines = [f"stage {worst['stage']} ({worst['window']} window), world {worst['world']}, rank {worst['rank']}: "
             f"the peak sample ({worst['label']}, of {worst['samples']})",
             "| owner | storages | resident MiB | allocated MiB |", "|---|---|---|---|"]
    for owner, row in worst["owners"].items():
        lines.append(f"| {owner} | {row['storages']} | {row['resident'] / MiB:.1f} | {row['allocated'] / MiB:.1f} |")
    lines.append(f"| **all owners** | | **{worst['accounted'] / MiB:.1f}** | |")
    lines.append("\nEach phase's own VmHWM over the import baseline (the next step, unwatched), MiB: " + ", ".join(
        f"{k} {max(r['phases'][k] for r in ranks) / MiB:.1f}" for k in worst["phases"]) +
        f" (RssShmem {worst['rss_shmem'] / MiB:.1f})")
    lines.append("largest storages: " + "; ".join(f"{p} ({o}) {r / MiB if r is not None else -1:.1f}/{n / MiB:.1f}"
                                                  for p, o, n, r in worst["largest"][:8]))
    return "\n".join(lines)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--stage", type=int, default=3, choices=(1, 2, 3))
    p.add_argument("--window", choices=("tight", "defaults"), default="tight")
    p.add_argument("--small", action="store_true", help="hidden 256, 4 blocks")
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--ffn-mult", type=int, default=4)
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--every", type=int, default=1, help="look at one in this many saved/unpacked tensors")
    p.add_argument("--json", default=None)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.small:
        args.hidden, args.layers = 256, 4
    return args


def main() -> None:
    args = parse()
    if args.worker:
        worker(args)
        return
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(args.world),
           os.path.abspath(__file__), "--worker", *sys.argv[1:]]
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [_ROOT, os.environ.get("PYTHONPATH")]))}
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    line = next((ln for ln in done.stdout.splitlines() if ln.startswith(PREFIX)), None)
    if done.returncode != 0 or line is None:
        raise SystemExit(f"error: the job failed (exit {done.returncode})\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    ranks = json.loads(line[len(PREFIX):])
    print(table(ranks))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(ranks, f, indent=2)


if __name__ == "__main__":
    main()
