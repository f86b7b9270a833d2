"""Exit codes of the benchmark's runs, round after round: does every finished run exit 0?

    python bench/exit_rounds.py --rounds 6                     # DDP, z1, z2 under torchrun; z2 under the launcher
    python bench/exit_rounds.py --rounds 6 --ab-path /tmp/main  # the same, each run also on another checkout

A round is plain DDP, zerorun stage 1 and stage 2, each one ``torchrun --standalone
--nproc_per_node 2`` job, then stage 2 under ``zerorun --num_gpus 2`` (bench/exit_job.py: the
benchmark's 25.5M-parameter model unless ``--hidden``/``--layers`` say otherwise, ``--steps`` steps,
ending as a script does). A run is bad when its exit code is not 0 or any rank printed "terminate
called". ``--ab-path DIR``: every run also runs with DIR's zerorun first on PYTHONPATH (arm A, e.g. a
checkout of the original main), right before this checkout's (arm B), so load hits both alike.
Prints one line per run and the counts per arm; logs of bad runs go to ``--logdir``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def command(kind: str, system: str, args: argparse.Namespace) -> list[str]:
    job = [str(HERE / "exit_job.py"), "--system", system, "--steps", str(args.steps), "--hidden", str(args.hidden),
           "--layers", str(args.layers), "--threads", "1"]
    if kind == "launcher":
        return [sys.executable, "-m", "zerorun.cli", "--num_gpus", "2", "--master_port", "auto", *job]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", *job]


def run_one(kind: str, system: str, arm: str, path: Path, args: argparse.Namespace, n: int) -> bool:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(path), os.environ.get("PYTHONPATH")]))}
    start = time.monotonic()
    proc = subprocess.run(command(kind, system, args), capture_output=True, text=True, env=env, cwd=path,
                          timeout=args.timeout)
    out = proc.stdout + proc.stderr
    bad = proc.returncode != 0 or "terminate called" in out
    print(f"run {n} arm {arm} {kind} {system}: exit {proc.returncode}"
          f"{' terminate' if 'terminate called' in out else ''} ({time.monotonic() - start:.0f} s)", flush=True)
    if bad:
        log = Path(args.logdir) / f"run{n}-{arm}-{kind}-{system}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text(out)
    return not bad


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--ab-path", default=None, help="another checkout: arm A, run before this one's every time")
    p.add_argument("--timeout", type=float, default=900)
    p.add_argument("--logdir", default="exit_rounds_logs")
    args = p.parse_args()
    arms = ([("A", Path(args.ab_path).resolve())] if args.ab_path else []) + [("B", ROOT)]
    plan = [("torchrun", "ddp"), ("torchrun", "z1"), ("torchrun", "z2"), ("launcher", "z2")]
    counts = {arm: {"zerorun": [0, 0], "ddp": [0, 0]} for arm, _ in arms}
    n = 0
    for _ in range(args.rounds):
        for kind, system in plan:
            for arm, path in arms:
                ok = run_one(kind, system, arm, path, args, n)
                row = counts[arm]["ddp" if system == "ddp" else "zerorun"]
                row[0] += ok
                row[1] += 1
                n += 1
    for arm, path in arms:
        z, d = counts[arm]["zerorun"], counts[arm]["ddp"]
        print(f"arm {arm} ({path}): zerorun runs exit 0: {z[0]}/{z[1]}; DDP runs exit 0: {d[0]}/{d[1]}", flush=True)


if __name__ == "__main__":
    main()
