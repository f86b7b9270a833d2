"""Run the benchmark job on every system, one torchrun job each, and print one table.

    python bench/compare.py                      # zerorun z0/z1/z2, DDP, ZeRO-optim, FSDP2 (+ DeepSpeed if importable)
    python bench/compare.py --systems torch-ddp,zerorun-z2 --steps 30
    python bench/compare.py --ds-python /path/to/venv/bin/python   # DeepSpeed from another environment

Ratios are to DDP in the same run: systems run one after another on the same machine,
so compare within a run, and repeat the run to see the noise.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
PREFIX = "BENCH_RESULT "
ZERORUN = ["zerorun-z0", "zerorun-z1", "zerorun-z2"]
TORCH = ["torch-ddp", "torch-zero-optim", "torch-fsdp2"]
DEEPSPEED = ["ds-z0", "ds-z1", "ds-z2"]


def deepspeed_python(explicit: str | None) -> str | None:
    candidates = [explicit] if explicit else [sys.executable]
    for py in candidates:
        ok = subprocess.run([py, "-c", "import deepspeed"], capture_output=True,
                            env={**os.environ, "DS_ACCELERATOR": "cpu"}).returncode == 0
        if ok:
            return py
    return None


def run_one(system: str, python: str, args: argparse.Namespace) -> dict | None:
    cmd = [python, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={args.world}",
           str(HERE / "run_system.py"), "--system", system, "--steps", str(args.steps),
           "--warmup", str(args.warmup), "--hidden", str(args.hidden), "--layers", str(args.layers),
           "--global-batch", str(args.global_batch), "--threads", str(args.threads)]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "DS_ACCELERATOR": "cpu",
           "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=args.timeout)
    for line in proc.stdout.splitlines():
        if line.startswith(PREFIX):
            return json.loads(line[len(PREFIX):])
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
    print(f"{system}: failed (exit {proc.returncode}): " + " | ".join(tail), file=sys.stderr)
    return None


def table(rows: list[dict]) -> str:
    ddp = next((r["step_median_s"] for r in rows if r["system"] == "torch-ddp"), None)
    ref = next((r for r in rows if r["system"] == "torch-ddp"), rows[0])
    head = ("| system | step median s | ratio to DDP | peak RSS MB | model state MB/rank | comm MB/step "
            "| final loss | d loss vs DDP | param L2 |")
    lines = [head, "|" + "---|" * 9]
    for r in rows:
        ratio = f"{r['step_median_s'] / ddp:.2f}" if ddp else "-"
        lines.append(f"| {r['system']} | {r['step_median_s']:.3f} | {ratio} | {r['peak_rss_mb']:.0f} | "
                     f"{r['state_mb_rank0']:.1f} | {r['comm_mb_per_step']:.1f} | {r['final_loss']:.7f} | "
                     f"{r['final_loss'] - ref['final_loss']:+.1e} | {r['param_l2']:.6f} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--systems", default="")
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--global-batch", type=int, default=128)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--timeout", type=int, default=900)
    p.add_argument("--ds-python", default=None, help="python of an environment with deepspeed")
    p.add_argument("--out", default=None, help="append the JSON records to this file")
    args = p.parse_args()
    ds_py = deepspeed_python(args.ds_python)
    systems = args.systems.split(",") if args.systems else ZERORUN + TORCH + (DEEPSPEED if ds_py else [])
    rows = []
    for system in systems:
        python = ds_py if system.startswith("ds-") else sys.executable
        if python is None:
            print(f"{system}: skipped (deepspeed is not importable)", file=sys.stderr)
            continue
        rec = run_one(system, python, args)
        if rec is not None:
            rows.append(rec)
            print(f"{system}: {rec['step_median_s']:.3f} s/step, loss {rec['final_loss']:.7f}", file=sys.stderr)
            if args.out:
                with open(args.out, "a") as f:
                    f.write(json.dumps(rec) + "\n")
    if rows:
        print(table(rows))


if __name__ == "__main__":
    main()
