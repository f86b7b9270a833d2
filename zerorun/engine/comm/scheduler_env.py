"""The job a process belongs to, read from whichever launcher started it (pure functions).

``zerorun``'s launcher and torchrun set ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``MASTER_ADDR`` and ``MASTER_PORT``. A script started by ``srun python train.py`` or
``mpirun python train.py`` sees only the scheduler's own variables; read as a world of
one, each of N tasks would train alone on ``cuda:0``. So, as torch's elastic launchers
and DeepSpeed's ``mpi_discovery`` do, the rank is read from (first match wins):

- ``RANK`` / ``WORLD_SIZE`` / ``LOCAL_RANK`` (zerorun, torchrun),
- ``OMPI_COMM_WORLD_{RANK,SIZE,LOCAL_RANK}`` (Open MPI's ``mpirun``),
- ``PMI_RANK`` / ``PMI_SIZE`` (MPICH, Intel MPI; ``MPI_LOCALRANKID`` when set),
- ``SLURM_PROCID`` / ``SLURM_NTASKS`` / ``SLURM_LOCALID`` (``srun``).

The rendezvous address is ``MASTER_ADDR``; under Slurm, when it is unset, the first host
of ``SLURM_NODELIST`` (where task 0 runs, in Slurm's block distribution). An MPI job has
no such list: without ``MASTER_ADDR`` it is refused, naming the fix.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from zerorun.engine.errors import EngineError

DEFAULT_PORT = 29500  # torch's and DeepSpeed's default rendezvous port


@dataclass(frozen=True)
class JobEnv:
    """Where this process sits in the job, and how the ranks meet."""

    rank: int
    world_size: int
    local_rank: int
    master_addr: str
    master_port: int
    source: str  # the launcher the variables came from, for messages

    def torch_env(self) -> dict[str, str]:
        """The variables torch's ``env://`` rendezvous reads."""
        return {"RANK": str(self.rank), "WORLD_SIZE": str(self.world_size), "LOCAL_RANK": str(self.local_rank),
                "MASTER_ADDR": self.master_addr, "MASTER_PORT": str(self.master_port)}


# (source, rank, world, local rank or None): checked in this order
_SCHEMES = (
    ("torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK"),
    ("mpirun (Open MPI)", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"),
    ("mpirun (PMI)", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"),
    ("srun", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"),
)


def first_host(nodelist: str) -> str:
    """The first host of a Slurm node list: ``"gpu[07-09,12],cpu1"`` -> ``"gpu07"``."""
    head = ""
    depth = 0
    for ch in nodelist.strip():  # the first item, up to a comma outside brackets
        if ch == "," and depth == 0:
            break
        depth += {"[": 1, "]": -1}.get(ch, 0)
        head += ch
    # each bracket group becomes its first element, zero padding kept ("[07-09]" -> "07")
    host = re.sub(r"\[([^\]]*)\]", lambda m: re.split(r"[,-]", m.group(1))[0], head)
    if not host or "[" in host or "]" in host:
        raise EngineError(f"cannot read the first host of SLURM_NODELIST={nodelist!r}",
                          "set MASTER_ADDR to the host of task 0 (e.g. `export MASTER_ADDR=$(scontrol show "
                          "hostnames $SLURM_NODELIST | head -n1)`)")
    return host


def _int(env: Mapping[str, str], key: str) -> int:
    try:
        return int(env[key])
    except ValueError as e:
        raise EngineError(f"{key}={env[key]!r} is not an integer", f"unset {key} or fix the launcher setting it") from e


def _master(env: Mapping[str, str], source: str, world: int) -> str:
    if "MASTER_ADDR" in env:
        return env["MASTER_ADDR"]
    if world == 1:
        return "127.0.0.1"
    if source == "srun" and (env.get("SLURM_NODELIST") or env.get("SLURM_JOB_NODELIST")):
        return first_host(env.get("SLURM_NODELIST") or env["SLURM_JOB_NODELIST"])
    raise EngineError(f"started by {source} as one of {world} ranks, but MASTER_ADDR is not set: the ranks "
                      "cannot find each other",
                      "export MASTER_ADDR=<host of rank 0> (and MASTER_PORT) to every rank, e.g. "
                      "`mpirun -x MASTER_ADDR=node1 -x MASTER_PORT=29500 python train.py`, or start the job "
                      "with `zerorun --hostfile HOSTS --launcher openmpi train.py`")


def _local_rank(env: Mapping[str, str], source: str, key: str, world: int) -> int:
    if key in env:
        return _int(env, key)
    if "LOCAL_RANK" in env:
        return _int(env, "LOCAL_RANK")
    if world == 1 or source == "torchrun":  # torchrun always sets it; a bare RANK keeps the old default
        return 0
    raise EngineError(f"started by {source} as one of {world} ranks, but neither {key} nor LOCAL_RANK is set: "
                      "every rank of a node would take the same GPU",
                      "export LOCAL_RANK (the rank's index on its node) to every rank, or start the job with "
                      "`zerorun --hostfile HOSTS --launcher openmpi train.py`")


def job_env(env: Mapping[str, str]) -> JobEnv | None:
    """The job described by ``env``, or None when no launcher started this process (a world of one)."""
    for source, rank_key, world_key, local_key in _SCHEMES:
        if rank_key not in env and world_key not in env:
            continue
        if rank_key not in env or world_key not in env:
            present, absent = (rank_key, world_key) if rank_key in env else (world_key, rank_key)
            raise EngineError(f"{present} is set but {absent} is not (a {source} job?)",
                              f"start the script with `zerorun --num_gpus N script.py` or torchrun, or set "
                              f"both {rank_key} and {world_key}")
        rank, world = _int(env, rank_key), _int(env, world_key)
        if not 0 <= rank < world:
            raise EngineError(f"{rank_key}={rank} is outside a world of {world_key}={world}",
                              "check the launcher's task count")
        local = _local_rank(env, source, local_key, world)
        port = _int(env, "MASTER_PORT") if "MASTER_PORT" in env else DEFAULT_PORT
        return JobEnv(rank, world, local, _master(env, source, world), port, source)
    return None
