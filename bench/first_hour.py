"""The README's main job against plain DDP under torchrun, side by side in one run.

    python bench/first_hour.py --repeats 3 --steps 60

Each repeat runs every arm once, in turn, so a load change on a shared machine hits
every arm alike. The arms, all on examples/train_toy.py's model at world 2:

* ``zerorun``: the README's command exactly, ``OMP_NUM_THREADS`` removed from the
  environment (a newcomer's shell), nothing else set;
* ``zerorun all-threads``: the same with every rank given all the cores' threads
  (``--threads_per_rank <cores>``: what the launcher did before it shared them out);
* ``zerorun bound``: the same with ``--bind_cores_to_rank`` (is binding worth a default?);
* ``torchrun DDP`` (fp32) and ``torchrun DDP bf16`` (autocast): bench/toy_ddp.py, plain DDP.

A system's figure is the median of its ``N ms/step`` lines after the first window
(10 steps; set-up and first calls), over every repeat; the ratio is to ``torchrun DDP``.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MS = re.compile(r"\| ([0-9.]+) ms/step")


def arms(py: str, steps: int, cores: int) -> dict[str, list[str]]:
    job = ["examples/train_toy.py", "--config", "templates/zero2.yaml", "--steps", str(steps), "--print-every", "1000"]
    zerorun = [py, "-m", "zerorun.cli", "--num_gpus", "2", "--master_port", "auto"]
    torchrun = [py, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "bench/toy_ddp.py",
                "--steps", str(steps)]
    return {
        "zerorun": [*zerorun, *job],
        "zerorun all-threads": [*zerorun, "--threads_per_rank", str(cores), *job],
        "zerorun bound": [*zerorun, "--bind_cores_to_rank", *job],
        "torchrun DDP": torchrun,
        "torchrun DDP bf16": [*torchrun, "--bf16"],
    }


def step_times(argv: list[str]) -> list[float]:
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({done.returncode}):\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return [float(m.group(1)) for m in MS.finditer(done.stdout)][1:]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--only", help="comma-separated arm names (default: all)")
    args = p.parse_args()
    cores = len(os.sched_getaffinity(0))
    table = arms(sys.executable, args.steps, cores)
    if args.only:
        table = {k: v for k, v in table.items() if k in args.only.split(",")}
    times: dict[str, list[float]] = {name: [] for name in table}
    for _ in range(args.repeats):
        for name, argv in table.items():
            times[name] += step_times(argv)
    base = statistics.median(times["torchrun DDP"]) if times.get("torchrun DDP") else None
    print(f"world 2, {cores} cores, {args.repeats} repeat(s) x {args.steps} steps, median of 10-step windows")
    print(f"{'arm':22} {'ms/step':>8} {'range':>13} {'vs DDP':>7}")
    for name, ts in times.items():
        med = statistics.median(ts)
        ratio = f"{med / base:.2f}x" if base else "-"
        print(f"{name:22} {med:8.1f} {min(ts):6.1f}-{max(ts):<6.1f} {ratio:>7}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
