"""The memory benchmark: each system's per-rank training-step peak, physically, against its floor.

    python bench/memory.py                                   # world 2, issue 19's 101.7M-parameter MLP
    python bench/memory.py --small --world 4                 # a quick check
    python bench/memory.py --ds-python $DS_VENV/bin/python --json memory.json
    python bench/memory.py --world 4 --estimate                # `zerorun estimate --measure`, stages 0-3

Every system trains the same model (bench/common.py's residual MLP; by default hidden 1024,
12 blocks, 101.7M parameters, fp32, AdamW) on the same data (micro batch 8), one system per
torchrun job on gloo, one job at a time. Per rank the peak is the kernel's RSS high-water
mark (``VmHWM``) over the training steps, reset when set-up ends (after ``malloc_trim(0)``,
by writing ``5`` to ``/proc/self/clear_refs``), less the RSS right after ``import torch`` (and torch.optim's lazy imports);
the worse rank counts. The floor is :func:`zerorun.estimate.floor.physical_floor` for the
system's stage (DDP: stage 0, FSDP2: stage 3), with the block as the unit; the activations
(a few MiB here) are counted in it.

``--estimate`` instead runs ``zerorun estimate --measure`` on the same model (examples/train_toy.py
at this hidden size and depth is the benchmark's MLP) and config (the stage's defaults, fp32,
AdamW from the config, the same micro batch; stage 3 releasing each unit and prefetching one
block), one stage at a time, and prints the estimate against the worse rank's physical peak.

Systems: torch-ddp, torch-fsdp2, zerorun-z0..z3, zerorun-z3-init (built under ``zero.Init``),
zerorun-z3-ckpt (each block under non-reentrant activation checkpointing), zerorun-z3-lora
(frozen bases, rank-8 adapters on every Linear of the blocks) - all four releasing each unit
after use and prefetching one block - zerorun-z3-defaults (DeepSpeed's stage-3 defaults,
which keep this whole model gathered from forward to backward), and ds-z0..z3 (DeepSpeed,
run by ``--ds-python`` with DS_ACCELERATOR=cpu; ds-z3 by default).

bf16 rows (not in the default set): zerorun-z3-bf16 (``bf16.enabled``, fp32 masters, gradient shard
and moments: 18 bytes per parameter over N) and zerorun-z3-bf16m (``bf16.bf16_master_weights_and_grads``
+ ``bf16_optimizer_states``: 8 bytes over N, DeepSpeed 0.19.8's figure at stage 3 too), both with the
config's AdamW and bf16 inputs; their floors count the bf16 terms (activations in bf16).
"""

from __future__ import annotations

import os
import sys

import torch  # first: the baseline is the resident set right after it (and torch.optim's imports)

# Constructing any torch.optim optimizer imports torch._dynamo lazily (74 MiB of resident
# libraries here): the same for every system, and no part of a model's state.
torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))])

_HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(_HERE)


def _load_meter():
    """zerorun's physical meter, loaded from its file: DeepSpeed's interpreter has no zerorun
    installed, and the file needs only torch. Its baseline is taken now, just after ``import torch``."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("_physical_memory",
                                                  os.path.join(_ROOT, "zerorun", "engine", "physical_memory.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


METER = _load_meter()

import argparse  # noqa: E402
import json  # noqa: E402
import subprocess  # noqa: E402
from typing import Any  # noqa: E402

import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402

sys.path.insert(0, _HERE)
import common as C  # noqa: E402
from memory_facts import LORA_RANK, bf16_block, block_numel, floor_bytes, masters_of, model_facts, stage_of  # noqa: E402, F401  (masters_of and model_facts: the tests read them here)

RESULT_PREFIX = "MEMBENCH_RESULT "
MiB = 2**20
SYSTEMS = ("torch-ddp", "torch-fsdp2", "zerorun-z0", "zerorun-z1", "zerorun-z2", "zerorun-z3", "zerorun-z3-init",
           "zerorun-z3-ckpt", "zerorun-z3-lora", "zerorun-z3-defaults")
# glibc made to hand freed buffers back to the kernel at once (zerorun.engine.physical_memory.return_freed_memory)
RETURNING_ALLOCATOR = {"MALLOC_MMAP_THRESHOLD_": str(128 * 1024), "MALLOC_TRIM_THRESHOLD_": str(128 * 1024)}
DS_SYSTEMS = ("ds-z3",)
BF16_SYSTEMS = ("zerorun-z3-bf16", "zerorun-z3-bf16m")


# ---- the model variants --------------------------------------------------------------------
class CheckpointedMLP(C.ResMLP):
    """The same MLP, each block recomputed in backward (torch's non-reentrant checkpointing)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from torch.utils.checkpoint import checkpoint

        for b in self.blocks:
            x = checkpoint(b, x, use_reentrant=False)
        return self.head(x)


class LoRALinear(nn.Module):
    """A frozen Linear plus a trainable low-rank update (B starts at zero: the base's output at first)."""

    def __init__(self, base: nn.Linear, rank: int) -> None:
        super().__init__()
        self.base = base.requires_grad_(False)
        self.down = nn.Linear(base.in_features, rank, bias=False)
        self.up = nn.Linear(rank, base.out_features, bias=False)
        nn.init.zeros_(self.up.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + self.up(self.down(x))


def build(system: str, args: argparse.Namespace) -> nn.Module:
    """The system's model: the benchmark MLP (same seed, same weights), checkpointed or with adapters."""
    if system.endswith("-ckpt"):
        torch.manual_seed(args.seed)
        return CheckpointedMLP(args.hidden, args.layers, args.ffn_mult)
    model = C.build_model(args)
    if system.endswith("-lora"):
        torch.manual_seed(args.seed + 1)
        for block in model.blocks:
            block.fc1, block.fc2 = LoRALinear(block.fc1, LORA_RANK), LoRALinear(block.fc2, LORA_RANK)
    return model


# ---- one system on every rank of a torchrun job --------------------------------------------
def _setup(system: str, args: argparse.Namespace, world: int):
    import run_system as R

    args.system = system
    if system.startswith("ds-"):
        return R.setup_deepspeed(args, build(system, args), world)[0]
    if system.startswith("torch-"):
        return R.setup_torch(args, build(system, args), world)[0]
    cfg = R.zerorun_config(args, world)
    if stage_of(system) == 3 and not system.endswith("-defaults"):
        # release each unit after use and prefetch one block: the floor's two gathered units. At
        # DeepSpeed's defaults (zerorun-z3-defaults) forward keeps every unit it will reuse within
        # 1e9 elements gathered for backward: this whole model.
        cfg["zero_optimization"].update(stage3_max_reuse_distance=0, stage3_prefetch_bucket_size=block_numel(args))
    if bf16_block(system) is not None:  # the config's AdamW: one optimizer for both master modes
        cfg.update(bf16=bf16_block(system), optimizer=R.ADAMW_BLOCK)
    if system.endswith("-init"):
        import zerorun

        with zerorun.zero.Init(config=cfg):
            model = build(system, args)
        return R.setup_zerorun(args, model, world, cfg)[0]
    return R.setup_zerorun(args, build(system, args), world, cfg)[0]


def worker(args: argparse.Namespace) -> None:
    """Set up, reset the peak, train ``--steps`` steps; rank 0 prints every rank's figures."""
    cpu = torch.device("cpu")
    baseline = METER.physical_figures(cpu)["host_baseline_rss"]
    if args.worker.startswith("ds-"):
        import deepspeed

        deepspeed.init_distributed(dist_backend="gloo")
    else:
        dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(args.threads)
    step = _setup(args.worker, args, world)
    batches = [[C.get_batch(args, s, rank, world)] for s in range(args.steps)]  # made before the reset
    if bf16_block(args.worker) is not None:
        batches = [[(x.bfloat16(), y) for x, y in b] for b in batches]
    setup_peak = METER.physical_figures(cpu)["host_peak_rss"]
    reset = METER.reset_peak(cpu)
    after_setup = METER.physical_figures(cpu)["host_rss"]
    losses, climb = [], []  # climb: the peak so far after each step (which step set it)
    for b in batches:
        losses.append(float(step(b)))
        climb.append(float(METER.physical_figures(cpu)["host_peak_rss"] - baseline))
    end = METER.physical_figures(cpu)
    local = torch.tensor([end["host_peak_rss"] - baseline, baseline, after_setup, end["host_rss"], setup_peak,
                          float(reset), *climb], dtype=torch.float64)
    gathered = [torch.zeros_like(local) for _ in range(world)]
    dist.all_gather(gathered, local)
    if rank == 0:
        rows = torch.stack(gathered).tolist()
        print(RESULT_PREFIX + json.dumps({
            "system": args.worker, "world": world, "losses": losses,
            "peak_bytes_per_rank": [int(r[0]) for r in rows], "baseline_rss_per_rank": [int(r[1]) for r in rows],
            "rss_after_setup_per_rank": [int(r[2]) for r in rows], "rss_end_per_rank": [int(r[3]) for r in rows],
            "setup_peak_rss_per_rank": [int(r[4]) for r in rows], "peak_was_reset": all(r[5] for r in rows),
            "peak_after_step_per_rank": [[int(v) for v in r[6:]] for r in rows]}),
            flush=True)
    dist.barrier()
    dist.destroy_process_group()


# ---- the driver: one job per system, then the table ----------------------------------------
def run_system(system: str, args: argparse.Namespace) -> dict[str, Any]:
    """One torchrun job of ``system`` on ``--world`` local ranks; its rank 0's result line."""
    python = args.ds_python if system.startswith("ds-") else sys.executable
    forwarded = ["--hidden", str(args.hidden), "--layers", str(args.layers), "--ffn-mult", str(args.ffn_mult),
                 "--global-batch", str(args.global_batch), "--steps", str(args.steps), "--seed", str(args.seed),
                 "--threads", str(args.threads)]
    cmd = [python, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(args.world),
           os.path.abspath(__file__), "--worker", system, *forwarded]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "DS_ACCELERATOR": "cpu",
           "PYTHONPATH": os.pathsep.join(filter(None, [_ROOT, os.environ.get("PYTHONPATH")]))}
    if system.startswith("ds-"):
        env["PYTHONPATH"] = os.environ.get("PYTHONPATH", "")  # DeepSpeed's interpreter: no zerorun on its path
    if args.allocator == "returning":
        env.update(RETURNING_ALLOCATOR)
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
    line = next((ln for ln in done.stdout.splitlines() if ln.startswith(RESULT_PREFIX)), None)
    if done.returncode != 0 or line is None:
        out = (done.stdout + done.stderr).splitlines()
        # the first lines that say what broke, then torchrun's summary
        said = [ln for ln in out if any(k in ln for k in ("Error", "error:", "terminate called", "Abort"))][:8]
        print(f"error: {system} failed (exit {done.returncode}):\n" + "\n".join(said + out[-12:]),
              file=sys.stderr, flush=True)
        return {"system": system, "error": f"exit {done.returncode}"}
    return json.loads(line[len(RESULT_PREFIX):])


def table(results: list[dict[str, Any]], args: argparse.Namespace) -> str:
    """Markdown: peak (worse rank), floor, peak / floor, and peak / DDP's peak on the same model."""
    ddp = next((r["peak_mib"] for r in results if r["system"] == "torch-ddp" and "error" not in r), None)
    lines = ["| system | stage | peak MiB (worse rank) | floor MiB | peak / floor | peak / DDP |",
             "|---|---|---|---|---|---|"]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['system']} | {r['stage']} | failed ({r['error']}) | {r['floor_mib']:.0f} | - | - |")
            continue
        vs = "-" if ddp is None or r["system"].endswith("-lora") else f"{r['peak_mib'] / ddp:.2f}"
        lines.append(f"| {r['system']} | {r['stage']} | {r['peak_mib']:.0f} | {r['floor_mib']:.0f} | "
                     f"{r['peak_over_floor']:.2f} | {vs} |")
    n = sum(p.numel() for p in C.build_model(args).parameters())
    lines.append(f"\n{n / 1e6:.1f}M parameters (hidden {args.hidden}, {args.layers} blocks), fp32 (-bf16 rows: bf16), AdamW, "
                 f"world {args.world} on gloo, micro batch {args.global_batch // args.world}, {args.steps} steps; "
                 f"allocator {args.allocator}; peak: VmHWM after a reset at the end of set-up, less RSS after "
                 "`import torch` and torch.optim's imports; "
                 "LoRA: frozen bases, not comparable with DDP on the full model")
    return "\n".join(lines)


# ---- --estimate: `zerorun estimate --measure` on the same model and config ------------------
def measure_config(stage: int, args: argparse.Namespace) -> dict[str, Any]:
    """The benchmark's zerorun config of ``stage``, with its AdamW named in the config (the toy
    script builds the optimizer from it)."""
    import run_system as R

    args.system = f"zerorun-z{stage}"
    cfg = R.zerorun_config(args, args.world)
    if stage == 3:
        cfg["zero_optimization"].update(stage3_max_reuse_distance=0, stage3_prefetch_bucket_size=block_numel(args))
    cfg["optimizer"] = {"type": "AdamW", "params": {"lr": C.LR, "betas": list(C.BETAS), "eps": C.EPS,
                                                     "weight_decay": C.WEIGHT_DECAY}}
    return cfg


def measure_stage(stage: int, args: argparse.Namespace) -> dict[str, Any]:
    """One ``zerorun estimate --measure --json`` run of the toy script at the benchmark's size; its JSON."""
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".json", prefix=f"zerorun-z{stage}-", delete=False) as f:
        json.dump(measure_config(stage, args), f)
    script = (f"{os.path.join(_ROOT, 'examples', 'train_toy.py')} --config {f.name} --hidden {args.hidden} "
              f"--layers {args.layers} --print-every 1000")
    cmd = [sys.executable, "-m", "zerorun.cli", "estimate", "--gpus", str(args.world), "--measure", script,
           "--measure-steps", str(args.steps), "--json"]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    if args.allocator == "returning":
        env.update(RETURNING_ALLOCATOR)
    try:
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
    finally:
        os.unlink(f.name)
    if done.returncode != 0:
        raise SystemExit(f"error: estimate --measure at stage {stage} failed (exit {done.returncode}):\n"
                         + "\n".join((done.stdout + done.stderr).splitlines()[-12:]))
    return json.loads(done.stdout[done.stdout.index("{"):])


def estimate_table(results: list[dict[str, Any]], args: argparse.Namespace) -> str:
    """Markdown: per stage the estimate, the worse rank's physical peak and their ratio."""
    lines = ["| stage | estimate MiB | physical peak MiB (worse rank) | peak / estimate |", "|---|---|---|---|"]
    for stage, r in enumerate(results):
        phys = r["physical"]
        lines.append(f"| {stage} | {phys['estimated_bytes'] / MiB:.0f} | {phys['peak_bytes'] / MiB:.0f} | "
                     f"{phys['ratio']:.3f} |")
    lines.append(f"\nworld {args.world} on gloo, allocator {args.allocator}, {args.steps} measured steps after one "
                 "warm-up step (`zerorun estimate --measure`: examples/train_toy.py at hidden "
                 f"{args.hidden}, {args.layers} blocks)")
    return "\n".join(lines)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--world", type=int, default=2, choices=(2, 3, 4))
    p.add_argument("--small", action="store_true", help="hidden 256, 4 blocks (2.2M parameters): a quick check")
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--ffn-mult", type=int, default=4)
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--global-batch", type=int, default=0, help=argparse.SUPPRESS)  # set from the micro batch
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--threads", type=int, default=1, help="threads per rank")
    p.add_argument("--systems", default=",".join(SYSTEMS),
                   help="comma-separated; ds-* need --ds-python; also " + ", ".join(BF16_SYSTEMS))
    p.add_argument("--ds-python", default=None, help="an interpreter with deepspeed: adds " + ", ".join(DS_SYSTEMS))
    p.add_argument("--json", default=None, metavar="FILE", help="also write the results as JSON (- for stdout)")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds per system")
    p.add_argument("--allocator", choices=("default", "returning"), default="default",
                   help="returning: glibc hands freed buffers back to the kernel at once (every system), so a "
                        "peak is what the process holds, not what the allocator retains")
    p.add_argument("--estimate", action="store_true",
                   help="run `zerorun estimate --measure` on the same model and config at stages 0-3 instead")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.small:
        args.hidden, args.layers = 256, 4
    if not args.global_batch:
        args.global_batch = args.micro_batch * args.world
    # run_system's zerorun and torch set-up read these
    args.gas, args.bucket, args.overlap, args.prefetch = 1, None, None, 2_200_000
    return args


def main() -> None:
    args = parse()
    if args.worker:
        worker(args)
        return
    if args.estimate:
        results = [measure_stage(stage, args) for stage in range(4)]
        print(estimate_table(results, args))
        if args.json:
            with open(args.json, "w") as f:
                json.dump(results, f, indent=2)
        return
    systems = [s for s in args.systems.split(",") if s]
    if args.ds_python:
        systems += [s for s in DS_SYSTEMS if s not in systems]
    if any(s.startswith("ds-") for s in systems) and not args.ds_python:
        raise SystemExit("error: ds-* systems need DeepSpeed's interpreter\nhint: pass --ds-python /path/to/python")
    results = []
    for system in systems:
        print(f"running {system} on {args.world} ranks ...", file=sys.stderr, flush=True)
        raw = run_system(system, args)  # a failed system is a row of the table, not the end of the run
        floor = floor_bytes(system, args, args.world)
        row = {**raw, "stage": stage_of(system), "floor_mib": floor / MiB}
        if "error" not in raw:
            peak = max(raw["peak_bytes_per_rank"])  # the worse rank counts
            row.update(peak_mib=peak / MiB, peak_over_floor=peak / floor)
        results.append(row)
    print(table(results, args))
    if args.json == "-":
        print(json.dumps(results, indent=2))
    elif args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    if any("error" in r for r in results):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
