"""Run the benchmark job on every system, one torchrun job each, and print one table.

    python bench/compare.py                      # zerorun z0/z1/z2, DDP, ZeRO-optim, FSDP2 (+ DeepSpeed if importable)
    python bench/compare.py --systems torch-ddp,zerorun-z2 --steps 30
    python bench/compare.py --ds-python /path/to/venv/bin/python   # DeepSpeed from another environment
    python bench/compare.py --ds-python /path/to/venv/bin/python --together   # ... in the same job as the rest

By default the systems run *interleaved*: one torchrun job builds every torch/zerorun
system and runs step s of each before step s+1 of any (DeepSpeed, from its own
environment, gets a second interleaved job), so a load change on a shared machine hits
every system alike and the ratios to DDP stay meaningful. Peak RSS is per process, so
each system then also runs alone for a few steps (``--rss-steps``) to measure it.
``--sequential`` runs each system alone for the full length instead.

A/B of two engines (or two settings) on a noisy machine: ``--ab-path DIR`` (another
checkout's root, run through PYTHONPATH) and/or ``--ab-env KEY=VALUE`` (repeatable)
define arm A, this checkout as it is arm B; the interleaved job runs ``--repeat`` times,
A then B each time, and each system's step time is read as its ratio to DDP in the same
job. The table gives both arms' median ratio and its spread over the repetitions:

    python bench/compare.py --systems torch-ddp,zerorun-z2 --ab-path /tmp/main --repeat 3 --rss-steps 0
    python bench/compare.py --ab-env MALLOC_MMAP_THRESHOLD_=131072 --ab-env MALLOC_TRIM_THRESHOLD_=131072
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
PREFIX = "BENCH_RESULT "
ZERORUN = ["zerorun-z0", "zerorun-z1", "zerorun-z2", "zerorun-z3", "zerorun-z3-reshard"]
TORCH = ["torch-ddp", "torch-zero-optim", "torch-fsdp2"]
DEEPSPEED = ["ds-z0", "ds-z1", "ds-z2", "ds-z3"]


def deepspeed_python(explicit: str | None) -> str | None:
    candidates = [explicit] if explicit else [sys.executable]
    for py in candidates:
        ok = subprocess.run([py, "-c", "import deepspeed"], capture_output=True,
                            env={**os.environ, "DS_ACCELERATOR": "cpu"}).returncode == 0
        if ok:
            return py
    return None


def run_job(system: str, python: str, args: argparse.Namespace, steps: int, warmup: int,
            extra_env: dict[str, str] | None = None) -> list[dict]:
    """One torchrun job running ``system`` (comma-separated: interleaved); its JSON records."""
    cmd = [python, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={args.world}",
           str(HERE / "run_system.py"), "--system", system, "--steps", str(steps),
           "--warmup", str(warmup), "--hidden", str(args.hidden), "--layers", str(args.layers),
           "--global-batch", str(args.global_batch), "--gas", str(args.gas), "--threads", str(args.threads)]
    cmd += ["--bucket", str(args.bucket)] if args.bucket is not None else []
    cmd += ["--overlap", args.overlap] if args.overlap is not None else []
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "DS_ACCELERATOR": "cpu",
           "PYTHONWARNINGS": "ignore"}
    if args.together:  # DeepSpeed's environment runs zerorun too: from this checkout
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE.parent), os.environ.get("PYTHONPATH")]))
    env.update(extra_env or {})
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=args.timeout)
    recs = [json.loads(line[len(PREFIX):]) for line in proc.stdout.splitlines() if line.startswith(PREFIX)]
    if not recs:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
        print(f"{system}: failed (exit {proc.returncode}): " + " | ".join(tail), file=sys.stderr)
    return recs


def table(rows: list[dict]) -> str:
    ddp = next((r["step_median_s"] for r in rows if r["system"] == "torch-ddp"), None)
    ref = next((r for r in rows if r["system"] == "torch-ddp"), rows[0])
    head = ("| system | step median s | ratio to DDP | peak RSS MB | model state MB/rank | comm MB/step "
            "| final loss | d loss vs DDP | param L2 |")
    lines = [head, "|" + "---|" * 9]
    for r in rows:
        ratio = f"{r['step_median_s'] / ddp:.2f}" if ddp else "-"
        rss = f"{r['peak_rss_mb']:.0f}" if r.get("peak_rss_mb") else "-"
        lines.append(f"| {r['system']} | {r['step_median_s']:.3f} | {ratio} | {rss} | "
                     f"{r['state_mb_rank0']:.1f} | {r['comm_mb_per_step']:.1f} | {r['final_loss']:.7f} | "
                     f"{r['final_loss'] - ref['final_loss']:+.1e} | {r['param_l2']:.6f} |")
    return "\n".join(lines)


def ab_arms(args: argparse.Namespace) -> list[tuple[str, dict[str, str]]]:
    """Arm A (``--ab-path`` through PYTHONPATH, ``--ab-env``) and arm B (this checkout, as is)."""
    env = dict(kv.split("=", 1) for kv in args.ab_env)
    if args.ab_path:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(args.ab_path).resolve()),
                                                          os.environ.get("PYTHONPATH")]))
    return [("A", env), ("B", {})]


def _median_range(values: list[float], fmt: str = "{:.3f}") -> str:
    if not values:
        return "-"
    return f"{fmt.format(statistics.median(values))} ({fmt.format(min(values))}-{fmt.format(max(values))})"


def ab_table(ratios: dict[str, dict[str, list[float]]], seconds: dict[str, dict[str, list[float]]] | None = None) -> str:
    """Per system: each arm's median ratio to DDP and its range over the repetitions, B / A, and
    (``seconds``) each arm's median step time: when the arms change DDP's own time too (they share
    its process and caches), the ratios alone mislead."""
    seconds = seconds or {}
    lines = ["| system | A: ratio to DDP, median (min-max) | B: ratio to DDP, median (min-max) | B / A "
             "| A: s/step | B: s/step |", "|---|---|---|---|---|---|"]
    for system in list(ratios) + [s for s in seconds if s not in ratios]:
        arms = ratios.get(system, {})
        both = arms.get("A") and arms.get("B")
        change = f"{statistics.median(arms['B']) / statistics.median(arms['A']):.3f}" if both else "-"
        secs = seconds.get(system, {})
        lines.append(f"| {system} | {_median_range(arms.get('A', []))} | {_median_range(arms.get('B', []))} | "
                     f"{change} | {_median_range(secs.get('A', []))} | {_median_range(secs.get('B', []))} |")
    return "\n".join(lines)


def run_ab(systems: list[str], args: argparse.Namespace) -> None:
    """``--repeat`` interleaved jobs per arm, A then B each time; the ratios to DDP of every job."""
    if "torch-ddp" not in systems:
        systems = ["torch-ddp", *systems]
    ratios: dict[str, dict[str, list[float]]] = {s: {} for s in systems if s != "torch-ddp"}
    seconds: dict[str, dict[str, list[float]]] = {s: {} for s in systems}
    for rep in range(args.repeat):
        for arm, env in ab_arms(args):
            rows = {r["system"]: r for r in run_job(",".join(systems), sys.executable, args, args.steps, args.warmup,
                                                    env)}
            ddp = rows.get("torch-ddp")
            for system, row in rows.items():
                seconds.setdefault(system, {}).setdefault(arm, []).append(row["step_median_s"])
                if ddp and system in ratios:
                    ratios[system].setdefault(arm, []).append(row["step_median_s"] / ddp["step_median_s"])
            print(f"repetition {rep + 1}, arm {arm}: DDP {ddp['step_median_s'] if ddp else float('nan'):.3f} s/step",
                  file=sys.stderr, flush=True)
            if args.out:
                with open(args.out, "a") as f:
                    for r in rows.values():
                        f.write(json.dumps({**r, "arm": arm, "repetition": rep}) + "\n")
    print(ab_table(ratios, seconds))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--systems", default="")
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--global-batch", type=int, default=128)
    p.add_argument("--gas", type=int, default=1, help="gradient accumulation steps (micro-batches per step)")
    p.add_argument("--bucket", type=int, default=None, help="zerorun reduce_bucket_size (default: config default)")
    p.add_argument("--overlap", choices=["true", "false"], default=None,
                   help="zerorun overlap_comm (default: the config default for the stage)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--timeout", type=int, default=900)
    p.add_argument("--ds-python", default=None, help="python of an environment with deepspeed")
    p.add_argument("--out", default=None, help="append the JSON records to this file")
    p.add_argument("--sequential", action="store_true", help="run each system alone (no interleaving)")
    p.add_argument("--together", action="store_true",
                   help="with --ds-python: run every system in one interleaved job in that environment "
                        "(zerorun from this checkout), so DeepSpeed's ratios share DDP's time window")
    p.add_argument("--rss-steps", type=int, default=4, help="steps of the run alone that measures peak RSS")
    p.add_argument("--ab-path", default=None, help="arm A: another checkout's root (through PYTHONPATH)")
    p.add_argument("--ab-env", action="append", default=[], metavar="KEY=VALUE", help="arm A: an environment variable")
    p.add_argument("--repeat", type=int, default=3, help="with --ab-*: interleaved jobs per arm")
    args = p.parse_args()
    ds_py = deepspeed_python(args.ds_python)
    systems = args.systems.split(",") if args.systems else ZERORUN + TORCH + (DEEPSPEED if ds_py else [])
    if not ds_py and any(x.startswith("ds-") for x in systems):
        print("ds-*: skipped (deepspeed is not importable)", file=sys.stderr)
        systems = [x for x in systems if not x.startswith("ds-")]
    if args.ab_path or args.ab_env:
        run_ab([x for x in systems if not x.startswith("ds-")], args)
        return
    groups = [[x for x in systems if not x.startswith("ds-")], [x for x in systems if x.startswith("ds-")]]
    pythons = [sys.executable, ds_py]
    if args.together and ds_py:  # one interleaved job for every system, DeepSpeed's included
        groups, pythons = [systems], [ds_py]
    rows: list[dict] = []
    for group, python in zip(groups, pythons, strict=True):
        if not group:
            continue
        if args.sequential:
            for system in group:
                rows += run_job(system, python, args, args.steps, args.warmup)
        else:
            rows += run_job(",".join(group), python, args, args.steps, args.warmup)
            for r in rows:
                if r["system"] in group and args.rss_steps > 0:
                    alone = run_job(r["system"], python, args, args.rss_steps, 1)
                    r["peak_rss_mb"] = alone[0]["peak_rss_mb"] if alone else None
    for r in rows:
        print(f"{r['system']}: {r['step_median_s']:.3f} s/step, loss {r['final_loss']:.7f}", file=sys.stderr)
        if args.out:
            with open(args.out, "a") as f:
                f.write(json.dumps(r) + "\n")
    if rows:
        print(table(rows))


if __name__ == "__main__":
    main()
