"""``zerorun --launcher slurm`` for real: inside ``salloc``/``sbatch`` allocations of a
one-machine Slurm cluster (tests/launcher_slurm.py) the launcher takes the allocation as
its hostfile and runs its 2 ranks with ``srun``. Checked: the ranks start with the right
rank variables; a failing rank ends the job with that rank's exit code and the report
names it; ``scancel`` and Ctrl-C leave no rank behind (checked by pid); ``zerorun doctor``
probes the node as a step of the allocation. Only the first
test imports torch (a gloo all-reduce): the others need no process group, which keeps
the module well under its 90 s budget on a loaded machine."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from launcher_conftest import SCRIPTS, wait_for_rank_pids, wait_gone, zerorun_argv
from launcher_slurm import SlurmCluster, slurm  # noqa: F401


def _zerorun(cluster: SlurmCluster, *args: str) -> list[str]:
    try:
        socket.gethostbyname(cluster.node)
        master: tuple[str, ...] = ()
    except OSError:  # the node name does not resolve here: rank 0's store on loopback
        master = ("--master_addr", "127.0.0.1")
    return zerorun_argv("--launcher", "slurm", "--master_port", "auto", "--kill_timeout", "3", *master, *args)


def _salloc(name: str) -> list[str]:
    return ["salloc", "--nodes=1", "--ntasks=2", f"--job-name={name}", "--quiet"]


def test_two_rank_gloo_job_inside_salloc(slurm: SlurmCluster, tmp_path: Path) -> None:  # noqa: F811
    argv = _salloc("zr-ok") + _zerorun(slurm, str(SCRIPTS / "allreduce.py"), "a b", "it's")
    out = subprocess.run(argv, cwd=tmp_path, env=slurm.env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    for rank in range(2):
        line = f"[{slurm.node}:{rank}] rank {rank}/2 local {rank} node 0 sum 3 args ['--local_rank={rank}', 'a b', \"it's\"]"
        assert line in out.stdout, out.stdout


def test_failing_rank_ends_the_job_with_its_exit_code(slurm: SlurmCluster, tmp_path: Path) -> None:  # noqa: F811
    pids = tmp_path / "pids"
    pids.mkdir()
    argv = _salloc("zr-fail") + _zerorun(slurm, str(SCRIPTS / "hang_or_fail.py"), "--pid_dir", str(pids),
                                         "--fail_rank", "1", "--exit_code", "7", "--no_torch")
    out = subprocess.run(argv, cwd=tmp_path, env=slurm.env, capture_output=True, text=True, timeout=60)
    teardown = time.time() - float((pids / "failed_at").read_text())
    assert out.returncode == 7, out.stderr
    assert f"[{slurm.node}:1] rank 1 fails now" in out.stderr
    assert f"zerorun: rank 1 on {slurm.node} failed (exit code 7); stopping every node" in out.stderr
    assert "rank      : 1 of 2 (local rank 1)" in out.stderr
    assert wait_gone([int((pids / f"rank{r}.pid").read_text()) for r in range(2)], timeout=1) == []
    print(f"slurm teardown: {teardown:.2f} s from the rank's failure to the launcher's exit")
    assert teardown < 10, f"teardown took {teardown:.1f} s"


def _start_hanging(cluster: SlurmCluster, tmp_path: Path, batch: bool) -> tuple[subprocess.Popen[str] | None, str, list[int]]:
    """The launcher with 2 sleeping ranks, inside ``salloc`` (its Popen) or as an ``sbatch`` job (its id)."""
    pids = tmp_path / "pids"
    pids.mkdir()
    job = _zerorun(cluster, str(SCRIPTS / "hang_or_fail.py"), "--pid_dir", str(pids), "--no_torch")
    proc = None
    if batch:  # sbatch runs the launcher on the node as a batch script
        argv = ["sbatch", "--parsable", "--nodes=1", "--ntasks=2", f"--output={tmp_path}/job.out",
                "--wrap", subprocess.list2cmdline(job)]
        name = subprocess.run(argv, cwd=tmp_path, env=cluster.env, capture_output=True, text=True,
                              check=True).stdout.strip().split(";")[0]
    else:
        name = f"zr-{uuid.uuid4().hex[:8]}"
        proc = subprocess.Popen(_salloc(name) + job, cwd=tmp_path, env=cluster.env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
    return proc, name, wait_for_rank_pids(pids, 2, timeout=30, proc=proc)


def test_scancel_of_an_sbatch_job_leaves_no_rank(slurm: SlurmCluster, tmp_path: Path) -> None:  # noqa: F811
    _, job_id, pids = _start_hanging(slurm, tmp_path, batch=True)
    subprocess.run(["scancel", job_id], env=slurm.env, check=True)
    assert wait_gone(pids, timeout=10) == []


def _children(pid: int) -> list[int]:
    kids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            kids.append(int(stat.parent.name))
    return kids


def test_ctrl_c_inside_salloc_leaves_no_rank(slurm: SlurmCluster, tmp_path: Path) -> None:  # noqa: F811
    proc, _, pids = _start_hanging(slurm, tmp_path, batch=False)
    assert proc is not None
    [launcher] = _children(proc.pid)  # salloc's command: the terminal's Ctrl-C goes to its process group
    os.kill(launcher, signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert "zerorun: Ctrl-C: forwarding SIGINT to every rank" in err
    assert proc.returncode == 130, err
    assert wait_gone(pids, timeout=5) == []


def test_doctor_probes_each_node_as_a_step_of_the_allocation(slurm: SlurmCluster, tmp_path: Path) -> None:  # noqa: F811
    import json

    with socket.socket() as s:
        s.bind(("", 0))
        port = str(s.getsockname()[1])
    launch = _zerorun(slurm)  # the same master address choice as the launches here
    master = launch[launch.index("--master_addr"):][:2] if "--master_addr" in launch else []
    argv = _salloc("zr-doctor") + zerorun_argv("doctor", "--launcher", "slurm", "--master_port", port, *master, "--json")
    out = subprocess.run(argv, cwd=tmp_path, env=slurm.env, capture_output=True, text=True, timeout=60)
    data = json.loads(out.stdout)
    assert out.returncode == 0 and data["ok"], out.stdout + out.stderr
    assert data["runner"] == "slurm" and [h["host"] for h in data["hosts"]] == [slurm.node]
    assert data["hosts"][0]["facts"]["network"]["connect"]["result"] == "ok"  # the listener ran as a step too


def test_allocation_is_the_hostfile() -> None:
    from launcher.errors import LaunchError
    from launcher.plan.allocation import allocation_hosts, tasks_per_node
    from launcher.plan.hostfile import Host

    assert tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    env = {"SLURM_JOB_NODELIST": "n[1-2]", "SLURM_TASKS_PER_NODE": "4(x2)"}
    expand = {"n[1-2]": ["n1", "n2"]}.__getitem__
    assert allocation_hosts(env, None, expand) == (Host("n1", 4), Host("n2", 4))
    assert allocation_hosts(env, 2, expand) == (Host("n1", 2), Host("n2", 2))
    with pytest.raises(LaunchError, match="SLURM_JOB_NODELIST is not set") as err:
        allocation_hosts({}, None, expand)
    assert "salloc" in err.value.hint
    with pytest.raises(LaunchError, match="cannot read 'x'"):
        tasks_per_node("x")
