"""Per-rank shim for ``srun`` and ``mpirun``: ``python -m launcher.shim [--pass_local_rank] -- CMD...``.

srun and mpirun start every rank themselves; this maps their variables (SLURM_*,
OMPI_COMM_WORLD_*) to the ones torch.distributed and zerorun read (RANK,
LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, NODE_RANK, ...) at rank start, then
replaces itself with the user's command.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping

from launcher.errors import LaunchError
from zerorun.compat.activate import rank_env as compat_env


def _slurm_local_size(env: Mapping[str, str]) -> str:
    if "SLURM_NTASKS_PER_NODE" in env:
        return env["SLURM_NTASKS_PER_NODE"]
    # SLURM_TASKS_PER_NODE looks like "2(x3),1": the first count is this layout's first node
    match = re.match(r"(\d+)", env.get("SLURM_TASKS_PER_NODE", "1"))
    return match.group(1) if match else "1"


def rank_vars(env: Mapping[str, str]) -> dict[str, str]:
    """RANK and friends from srun's or mpirun's variables (pure)."""
    if "OMPI_COMM_WORLD_RANK" in env:
        node = env.get("OMPI_COMM_WORLD_NODE_RANK", "0")
        out = {
            "RANK": env["OMPI_COMM_WORLD_RANK"], "WORLD_SIZE": env["OMPI_COMM_WORLD_SIZE"],
            "LOCAL_RANK": env["OMPI_COMM_WORLD_LOCAL_RANK"], "LOCAL_WORLD_SIZE": env["OMPI_COMM_WORLD_LOCAL_SIZE"],
            "NODE_RANK": node,
        }
    elif "SLURM_PROCID" in env:
        out = {
            "RANK": env["SLURM_PROCID"], "WORLD_SIZE": env["SLURM_NTASKS"], "LOCAL_RANK": env["SLURM_LOCALID"],
            "LOCAL_WORLD_SIZE": _slurm_local_size(env), "NODE_RANK": env.get("SLURM_NODEID", "0"),
        }
    else:
        raise LaunchError(
            "launcher.shim found neither SLURM_PROCID nor OMPI_COMM_WORLD_RANK",
            "the shim runs under srun or mpirun; use `zerorun --launcher local` to run here",
        )
    out["LOCAL_SIZE"] = out["LOCAL_WORLD_SIZE"]
    out["GROUP_RANK"] = out["CROSS_RANK"] = out["NODE_RANK"]
    return out


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    pass_local_rank, at = False, None
    if args and args[0].split("=", 1)[0] == "--pass_local_rank":  # `=K`: insert at K (before the script's args)
        pass_local_rank, at, args = True, (int(args[0].split("=", 1)[1]) if "=" in args[0] else None), args[1:]
    if args and args[0] == "--":
        args = args[1:]
    if not args:
        print("usage: python -m launcher.shim [--pass_local_rank[=K]] -- COMMAND [ARGS]", file=sys.stderr)
        return 2
    env = {**os.environ, **rank_vars(os.environ)}
    env.update(compat_env(env))  # ZERORUN_AS_DEEPSPEED: the `deepspeed` package on PYTHONPATH
    if pass_local_rank:
        args.insert(len(args) if at is None else at, f"--local_rank={env['LOCAL_RANK']}")
    os.execvpe(args[0], args, env)
    return 127  # not reached


if __name__ == "__main__":
    sys.exit(main())
