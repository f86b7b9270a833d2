"""Round after round of tiny world-2 jobs, each rank a process that ends as a script does (it returns
and the interpreter exits); prints one JSON line per rank: its exit code, whether it printed
"terminate called", and which threads were still alive at its last exit handler.

    python tests/engine/exit_rounds.py --rounds 8 --systems ddp,z1,z2,z3

torch (and what a rank imports later: torch._dynamo, the engine) is imported once, here: each rank is a fork of this process that then runs the job and exits
through the interpreter's own finalization (atexit handlers, module teardown, C++ static
destructors), as a rank started by a launcher does, for a fraction of a fresh process's start-up.
Run ``i`` ends the ``i``-th way of :data:`ENDINGS` (nothing; ``engine.destroy()``; the script's own
``destroy_process_group``), and each system runs on a process group the script created itself every
other round (else zerorun creates it).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import tempfile

import torch
import torch._dynamo  # noqa: F401  # imported by a rank's first collective: once here, not in every rank (~5 s)
import torch.distributed as dist
from torch import nn

import zerorun
import zerorun.config.load  # noqa: F401  # what zerorun.initialize imports, once here
import zerorun.engine.api  # noqa: F401

ENDINGS = ("nothing", "destroy", "group")
THREADS_TAG = "EXIT-THREADS "


def _threads_at_exit() -> None:
    """Registered first, so it runs last: the threads still alive when the interpreter finalizes."""
    names = []
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                names.append(f.read().strip())
        except OSError:
            continue
    print(THREADS_TAG + json.dumps(sorted(names)), flush=True)


def job(system: str, ending: str, user_group: bool, steps: int) -> None:
    """One rank's script: a tiny model, ``steps`` steps, then ``ending``."""
    import atexit

    atexit.register(_threads_at_exit)
    torch.set_num_threads(1)
    if user_group or system == "ddp":
        dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4))
    x, y = torch.randn(4, 8), torch.randn(4, 4)
    if system == "ddp":
        ddp = nn.parallel.DistributedDataParallel(model)
        opt = torch.optim.AdamW(ddp.parameters(), lr=1e-3)
        for _ in range(steps):
            nn.functional.mse_loss(ddp(x), y).backward()
            opt.step()
            opt.zero_grad()
        engine = None
    else:
        cfg = {"train_micro_batch_size_per_gpu": 4, "steps_per_print": steps,
               "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
               "zero_optimization": {"stage": int(system[1:])}}
        engine, _, _, _ = zerorun.initialize(model=model, model_parameters=model.parameters(), config=cfg)
        for _ in range(steps):
            engine.backward(nn.functional.mse_loss(engine(x), y))
            engine.step()
    gathered = [torch.zeros(2) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, torch.tensor([float(dist.get_rank()), float(steps)]))  # as a benchmark ends
    dist.barrier()
    if ending == "destroy" and engine is not None:
        engine.destroy()
    elif ending == "group":
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rank(log: str, env: dict[str, str], args: tuple[str, str, bool, int]) -> None:
    """In the forked child: output to ``log``, then the job, then a normal interpreter exit."""
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.environ.update(env)
    job(*args)
    sys.exit(0)  # unwinds to the top of this script: the interpreter finalizes as after any script


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--systems", default="ddp,z1,z2,z3")
    p.add_argument("--steps", type=int, default=2)
    a = p.parse_args()
    tmp = tempfile.mkdtemp(prefix="zerorun-exit-")
    run = 0
    for r in range(a.rounds):
        for index, system in enumerate(a.systems.split(",")):
            ending, user_group = ENDINGS[run % len(ENDINGS)], (r + index) % 2 == 1  # each system both ways
            env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()), "WORLD_SIZE": "2",
                   "LOCAL_WORLD_SIZE": "2", "OMP_NUM_THREADS": "1"}
            children = {}
            for rank in range(2):
                log = os.path.join(tmp, f"{run}-{system}-{rank}.log")
                pid = os.fork()
                if pid == 0:
                    _rank(log, {**env, "RANK": str(rank), "LOCAL_RANK": str(rank)},
                          (system, ending, user_group, a.steps))
                children[pid] = (rank, log)
            for pid, (rank, log) in children.items():
                _, status = os.waitpid(pid, 0)
                with open(log, errors="replace") as f:
                    text = f.read()
                threads = [json.loads(line[len(THREADS_TAG):]) for line in text.splitlines()
                           if line.startswith(THREADS_TAG)]
                print(json.dumps({"round": r, "run": run, "system": system, "ending": ending, "user_group": user_group,
                                  "rank": rank, "exit": os.waitstatus_to_exitcode(status),
                                  "terminate": "terminate called" in text, "threads": threads[-1] if threads else None,
                                  "tail": text.strip().splitlines()[-3:]}), flush=True)
            run += 1


if __name__ == "__main__":
    main()
