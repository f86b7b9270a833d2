"""Launcher benchmark: zerorun against torchrun on the same script, on this machine.

Two figures, each the median of ``--repeats`` runs:

* start: from the launcher's start to the moment every rank runs its first line
  (before ``import torch``), and to the moment every rank has passed
  ``init_process_group`` + a barrier (gloo);
* teardown: from a rank's failure (rank 1 exits 7 after the barrier; the others sleep,
  as ranks stuck in an NCCL collective would) to the launcher's exit with every rank
  gone; plus the exit status each launcher returns.

    python bench/launch_bench.py --nproc 2 --repeats 3
    python bench/launch_bench.py --zerorun_args "--hostfile H --launcher ssh --ssh_args '-i key'"

``--zerorun_args`` adds launcher options (e.g. a hostfile for multi-node zerorun runs;
torchrun cannot fan out, so it always runs on this machine).
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

RANK_SCRIPT = textwrap.dedent("""\
    import os, sys, time
    out = sys.argv[1]; mode = sys.argv[2]; rank = int(os.environ["RANK"])
    open(os.path.join(out, f"first{rank}"), "w").write(repr(time.time()))
    open(os.path.join(out, f"pid{rank}"), "w").write(str(os.getpid()))
    import torch.distributed as dist
    dist.init_process_group("gloo"); dist.barrier()
    open(os.path.join(out, f"ready{rank}"), "w").write(repr(time.time()))
    if mode == "fail":
        if rank == 1:
            time.sleep(1.0)
            open(os.path.join(out, "failed_at"), "w").write(repr(time.time()))
            sys.exit(7)
        while True:
            time.sleep(3600)
    dist.destroy_process_group()
""")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def one_run(launcher: list[str], script: Path, nproc: int, mode: str) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as out:
        t0 = time.time()
        done = subprocess.run([*launcher, str(script), out, mode], capture_output=True, text=True, timeout=300)
        t_end = time.time()
        read = lambda name: float((Path(out) / name).read_text())  # noqa: E731
        result = {
            "exit_code": done.returncode,
            "start_to_first_line_s": max(read(f"first{r}") for r in range(nproc)) - t0,
            "start_to_ready_s": max(read(f"ready{r}") for r in range(nproc)) - t0,
        }
        if mode == "fail":
            pids = [int((Path(out) / f"pid{r}").read_text()) for r in range(nproc)]
            result["failure_to_exit_s"] = t_end - read("failed_at")
            result["ranks_left_after_exit"] = sum(_alive(p) for p in pids)
        return result


def median(runs: list[dict[str, float]]) -> dict[str, float]:
    keys = runs[0].keys()
    return {k: round(statistics.median(r[k] for r in runs), 3) for k in keys}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--zerorun_args", default="", help="extra zerorun options, one quoted string")
    p.add_argument("--world", type=int, default=None,
                   help="total ranks when --zerorun_args names a hostfile (then torchrun, one machine only, is skipped)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    script = Path(tempfile.mkdtemp()) / "bench_rank.py"
    script.write_text(RANK_SCRIPT)
    launchers = {
        "zerorun": [sys.executable, "-m", "zerorun.cli", "--num_gpus", str(args.nproc), "--master_port", "auto",
                    "--kill_timeout", "10", "--no_local_rank", *shlex.split(args.zerorun_args)],
    }
    world = args.world or args.nproc
    if args.world is None:
        launchers["torchrun"] = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                                 f"--nproc-per-node={args.nproc}"]
    results = {}
    for name, argv in launchers.items():
        results[name] = {
            "start": median([one_run(argv, script, world, "ok") for _ in range(args.repeats)]),
            "failure": median([one_run(argv, script, world, "fail") for _ in range(args.repeats)]),
        }
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    print(f"{world} ranks, median of {args.repeats} runs each")
    print(f"{'launcher':10} {'start->first line':>18} {'start->ready':>13} {'failure->exit':>14} {'exit code':>10} {'left':>5}")
    for name, r in results.items():
        s, f = r["start"], r["failure"]
        print(f"{name:10} {s['start_to_first_line_s']:>17.2f}s {s['start_to_ready_s']:>12.2f}s "
              f"{f['failure_to_exit_s']:>13.2f}s {int(f['exit_code']):>10} {int(f['ranks_left_after_exit']):>5}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
