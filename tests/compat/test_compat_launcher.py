"""DeepSpeed's launcher conventions: --local_rank before the script's arguments by default,
--no_local_rank, --bind_cores_to_rank with real affinity, and the srun/mpirun shim's insertion."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from launcher_conftest import zerorun_argv

from launcher.args import parse_args
from launcher.errors import LaunchError
from launcher.plan.affinity import core_share, parse_core_list
from launcher.plan.filters import select
from launcher.plan.hostfile import Host
from launcher.plan.launch_plan import build_plan, rank_argv
from launcher.run import shim as shim_module

PROBE = """\
import json, os, sys
with open(f"rank{os.environ['RANK']}.json", "w") as fh:
    json.dump({"argv": sys.argv[1:], "affinity": sorted(os.sched_getaffinity(0)),
               "omp": os.environ.get("OMP_NUM_THREADS"),
               "status": [l for l in open("/proc/self/status") if l.startswith("Cpus_allowed_list")]}, fh)
"""


def _run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "probe.py").write_text(PROBE)
    return subprocess.run(zerorun_argv(*args), cwd=tmp_path, capture_output=True, text=True, timeout=120)


def _probe(tmp_path: Path, rank: int) -> dict:
    return json.loads((tmp_path / f"rank{rank}.json").read_text())


def test_local_rank_is_passed_by_default_and_no_local_rank_turns_it_off() -> None:
    assert parse_args(["t.py"]).pass_local_rank is True
    assert parse_args(["--no_local_rank", "t.py"]).pass_local_rank is False
    assert parse_args(["--pass_local_rank", "t.py"]).pass_local_rank is True  # the old opt-in still parses


def test_local_rank_goes_before_the_script_arguments() -> None:
    cmd = ["py", "-u", "-m", "pkg.train", "--lr", "1"]
    plan = build_plan(select((Host("localhost", 2),)), command=cmd, job_id="j", cwd="/w", python="py",
                      local=True, pass_local_rank=True, args_start=4)
    assert rank_argv(plan, 1) == ["py", "-u", "-m", "pkg.train", "--local_rank=1", "--lr", "1"]


def test_shim_inserts_local_rank_at_the_given_index(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict = {}

    def fake_shim(args: list[str], env: dict) -> None:  # records the command instead of starting it
        seen.update(args=args)
        raise OSError(2, "not started in this test")

    monkeypatch.setattr(shim_module, "RankShim", fake_shim)
    monkeypatch.setenv("SLURM_PROCID", "3")
    monkeypatch.setenv("SLURM_NTASKS", "4")
    monkeypatch.setenv("SLURM_LOCALID", "1")
    monkeypatch.setenv("SLURM_TASKS_PER_NODE", "2(x2)")
    assert shim_module.main(["--pass_local_rank=3", "--", "py", "-u", "t.py", "--x", "1"]) == 127
    assert seen["args"] == ["py", "-u", "t.py", "--local_rank=1", "--x", "1"]


def test_two_ranks_get_local_rank_first_and_none_with_no_local_rank(tmp_path: Path) -> None:
    out = _run(tmp_path, "--num_gpus", "2", "--master_port", "auto", "probe.py", "--lr", "3")
    assert out.returncode == 0, out.stdout + out.stderr
    assert [_probe(tmp_path, r)["argv"] for r in (0, 1)] == [["--local_rank=0", "--lr", "3"],
                                                            ["--local_rank=1", "--lr", "3"]]
    out = _run(tmp_path, "--num_gpus", "2", "--master_port", "auto", "--no_local_rank", "probe.py", "--lr", "3")
    assert out.returncode == 0, out.stdout + out.stderr
    assert _probe(tmp_path, 1)["argv"] == ["--lr", "3"]


def test_core_shares_are_even_and_contiguous() -> None:
    assert parse_core_list("0,2-4,7") == [0, 2, 3, 4, 7]
    cores = [0, 1, 2, 3, 4, 5, 6]
    assert [core_share(cores, r, 3) for r in range(3)] == [[0, 1], [2, 3], [4, 5]]  # core 6 left unused
    with pytest.raises(LaunchError, match="1 core"):
        core_share([0], 0, 2)
    with pytest.raises(LaunchError, match="bad item"):
        parse_core_list("3-1")


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 cores to give each of 2 ranks its own")
def test_bind_cores_to_rank_sets_real_affinity(tmp_path: Path) -> None:
    cores = sorted(os.sched_getaffinity(0))[:2]
    out = _run(tmp_path, "--num_gpus", "2", "--master_port", "auto", "--bind_cores_to_rank",
               "--bind_core_list", ",".join(map(str, cores)), "probe.py")
    assert out.returncode == 0, out.stdout + out.stderr
    for rank in (0, 1):
        got = _probe(tmp_path, rank)
        assert got["affinity"] == [cores[rank]] and got["omp"] == "1"
        assert got["status"] == [f"Cpus_allowed_list:\t{cores[rank]}\n"]


def test_bind_cores_with_too_few_cores_fails_before_any_rank_starts(tmp_path: Path) -> None:
    out = _run(tmp_path, "--num_gpus", "2", "--bind_cores_to_rank", "--bind_core_list", "0", "probe.py")
    assert out.returncode == 1 and "1 core(s) for 2 ranks" in out.stderr
    assert not (tmp_path / "rank0.json").exists()


def test_master_addr_and_port_spellings() -> None:
    ns = parse_args(["--master_addr", "10.0.0.1", "--master_port", "29600", "t.py"])
    assert (ns.master_addr, ns.master_port) == ("10.0.0.1", "29600")
    ns = parse_args(["--master_addr=10.0.0.2", "--master_port=29601", "t.py"])
    assert (ns.master_addr, ns.master_port) == ("10.0.0.2", "29601")


def test_plan_with_the_new_fields_round_trips_through_json() -> None:
    from launcher.plan.launch_plan import AgentOptions, LaunchPlan

    plan = build_plan(select((Host("localhost", 2),)), command=["py", "-u", "t.py", "--x"], job_id="j", cwd="/w",
                      python="py", local=True, pass_local_rank=True, args_start=3,
                      options=AgentOptions(bind_cores=True, bind_core_list="0-3"))
    assert LaunchPlan.from_dict(json.loads(json.dumps(plan.to_dict()))) == plan
