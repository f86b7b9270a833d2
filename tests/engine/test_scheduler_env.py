"""srun / mpirun without zerorun's launcher: the job is read from the scheduler's variables.

The pure function maps an environment to (rank, world, local rank, rendezvous); one test
starts two real processes with only srun's variables and checks that they form one world
of two, not two worlds of one.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.plan.port import free_port
from tests.child_output import own_words
from zerorun.engine.comm.scheduler_env import JobEnv, first_host, job_env
from zerorun.engine.errors import EngineError


def test_no_launcher_is_a_world_of_one() -> None:
    assert job_env({"HOME": "/root"}) is None


def test_torchrun_variables_come_first() -> None:
    env = {"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "MASTER_ADDR": "n0", "MASTER_PORT": "1234",
           "SLURM_PROCID": "0", "SLURM_NTASKS": "1"}
    assert job_env(env) == JobEnv(3, 8, 1, "n0", 1234, "torchrun")


def test_srun_takes_the_first_host_of_the_node_list() -> None:
    env = {"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1", "SLURM_NODELIST": "gpu[07-09,12],cpu1"}
    assert job_env(env) == JobEnv(5, 8, 1, "gpu07", 29500, "srun")


def test_open_mpi_and_pmi() -> None:
    ompi = {"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "0",
            "MASTER_ADDR": "h1", "MASTER_PORT": "29600"}
    assert job_env(ompi) == JobEnv(2, 4, 0, "h1", 29600, "mpirun (Open MPI)")
    pmi = {"PMI_RANK": "1", "PMI_SIZE": "2", "MPI_LOCALRANKID": "1", "MASTER_ADDR": "h1"}
    assert job_env(pmi) == JobEnv(1, 2, 1, "h1", 29500, "mpirun (PMI)")


def test_mpirun_without_master_addr_is_refused_naming_the_fix() -> None:
    with pytest.raises(EngineError, match="MASTER_ADDR is not set") as e:
        job_env({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "0"})
    assert "mpirun -x MASTER_ADDR" in e.value.hint


def test_a_half_set_or_inconsistent_job_is_an_error() -> None:
    with pytest.raises(EngineError, match="SLURM_PROCID is set but SLURM_NTASKS is not"):
        job_env({"SLURM_PROCID": "0"})
    with pytest.raises(EngineError, match="outside a world"):
        job_env({"PMI_RANK": "2", "PMI_SIZE": "2", "MASTER_ADDR": "h"})
    with pytest.raises(EngineError, match="neither MPI_LOCALRANKID nor LOCAL_RANK"):
        job_env({"PMI_RANK": "0", "PMI_SIZE": "2", "MASTER_ADDR": "h"})


@pytest.mark.parametrize(("nodelist", "host"), [
    ("node1", "node1"), ("node[01-04]", "node01"), ("a[3,5-6],b[1-2]", "a3"),
    ("rack[2-3]-n[010-011]", "rack2-n010"), ("10.0.0.5,10.0.0.6", "10.0.0.5"),
])
def test_first_host(nodelist: str, host: str) -> None:
    assert first_host(nodelist) == host


WORLD = """
import torch.distributed as dist
from zerorun.engine.comm.bootstrap import init_distributed
ctx = init_distributed()
t = __import__("torch").ones(1)
dist.all_reduce(t)
print(ctx.rank, ctx.world_size, ctx.local_rank, int(t.item()))
"""


def test_two_srun_tasks_form_one_world_of_two() -> None:
    """Only srun's variables: today's code would start two worlds of one (and sum to 1)."""
    base = {k: v for k, v in os.environ.items()
            if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR") and not k.startswith(("SLURM_", "OMPI_"))}
    base.update(SLURM_NTASKS="2", SLURM_NODELIST="127.0.0.1", MASTER_PORT=str(free_port()), OMP_NUM_THREADS="1")
    procs = [subprocess.Popen([sys.executable, "-c", WORLD], env={**base, "SLURM_PROCID": str(r), "SLURM_LOCALID": str(r)},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              cwd=Path(__file__).resolve().parents[2]) for r in range(2)]
    try:
        outs = [p.communicate(timeout=90) for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert [p.returncode for p in procs] == [0, 0], [e for _, e in outs]
    assert sorted(own_words(o) for o, _ in outs) == [["0", "2", "0", "2"], ["1", "2", "1", "2"]]
