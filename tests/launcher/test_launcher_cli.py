"""The launcher end to end on this machine: argument splitting, --help, errors through
the CLI's error boundary, --dry-run (text and JSON), config validation before any rank
starts, and real local runs (2 CPU ranks on gloo; teardown on Ctrl-C and when the
launcher itself is killed). No GPU here: CUDA_VISIBLE_DEVICES must stay unset."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest
from launcher_conftest import (
    SCRIPTS,
    launch_tree,
    wait_for_rank_pids,
    wait_gone,
    wait_groups_gone,
    zerorun_argv,
)

from launcher.args import parse_args, parse_rank_list
from launcher.errors import LaunchError

ENV = {**os.environ, "HF_TOKEN": "hf_s3cret_value"}


def run(*args: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(zerorun_argv(*args), cwd=cwd, env=ENV, capture_output=True, text=True, timeout=timeout)


def test_options_stop_at_the_script() -> None:
    ns = parse_args(["--num_gpus", "2", "--env=A=1", "--pass_local_rank", "t.py", "--num_gpus", "9", "--", "-x"])
    assert (ns.num_gpus, ns.env, ns.pass_local_rank, ns.script) == (2, ["A=1"], True, "t.py")
    assert ns.script_args == ["--num_gpus", "9", "--", "-x"]
    assert parse_args(["--", "-weird.py", "a"]).script == "-weird.py"
    assert parse_rank_list("0,2-4") == (0, 2, 3, 4)
    with pytest.raises(LaunchError, match="--ranks 'x': bad item 'x'"):
        parse_rank_list("x")


def test_help_lists_every_option_with_examples(tmp_path: Path) -> None:
    out = run("launch", "--help", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    for flag in ("--hostfile", "--include", "--exclude", "--num_nodes", "--num_gpus", "--nproc_per_node", "--master_addr",
                 "--master_port", "--launcher", "--ssh_port", "--ssh_args", "--env", "--env_file", "--config",
                 "--pass_local_rank", "--log_dir", "--ranks", "--kill_timeout", "--dry-run", "--json", "--no_ssh_check",
                 "--quiet", "--progress_every", "--stall_timeout", "--setup_timeout", "--on_stall", "--report_json",
                 "--straggler_factor", "--straggler_steps"):
        assert flag in out.stdout, flag
    assert "Examples:" in out.stdout and "--num-gpus" in out.stdout  # both spellings, said once


def test_missing_hostfile_fails_through_the_error_boundary(tmp_path: Path) -> None:
    out = run("--hostfile", "nope", "t.py", cwd=tmp_path)
    assert out.returncode == 1
    assert "error: hostfile 'nope' does not exist" in out.stderr and "hint:" in out.stderr


def test_dry_run_json_and_text(tmp_path: Path) -> None:
    (tmp_path / "hosts").write_text("n1 slots=2\nn2 slots=1 # small\n")
    out = run("-H", "hosts", "--launcher", "ssh", "--master_port", "1234", "--dry-run", "--json", "t.py", "--lr", "1",
              cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert {k: data[k] for k in ("world_size", "master_addr", "master_port", "nodes")} == {
        "world_size": 3, "master_addr": "n1", "master_port": 1234,
        "nodes": [{"host": "n1", "node_rank": 0, "slots": [0, 1], "devices": ["0", "1"], "ranks": [0, 1]},
                  {"host": "n2", "node_rank": 1, "slots": [0], "devices": ["0"], "ranks": [2]}],
    }
    assert [c[:2] + c[-2:-1] for c in data["commands"]] == [["ssh", "-T", "n1"], ["ssh", "-T", "n2"]]
    assert data["commands"][1][-1].endswith("launcher.run.agent --node_rank 1")
    assert "HF_TOKEN" in data["exported_env"] and "hf_s3cret_value" not in out.stdout
    text = run("-H", "hosts", "--launcher", "pdsh", "--dry-run", "t.py", cwd=tmp_path)
    assert text.returncode == 0, text.stderr
    assert "3 rank(s) on 2 node(s), launcher pdsh" in text.stdout
    assert "n2    1     2             0            0" in text.stdout
    assert "master    n1:29500  (first node of the hostfile (n1)" in text.stdout
    assert "HF_TOKEN=<redacted>" in text.stdout and "hf_s3cret_value" not in text.stdout
    assert "[node 1] PDSH_RCMD_TYPE=ssh" in text.stdout and "--node_rank 1 --payload" in text.stdout
    assert not (tmp_path / ".zerorun").exists()  # a dry run contacts nobody and writes nothing


def test_default_runner_choice(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from launcher.main import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "one-local").write_text("localhost slots=2\n")
    (tmp_path / "one-remote").write_text("n7 slots=2\n")
    for args, expected in ((["-H", "one-local"], "local"), (["-H", "one-remote"], "ssh"), (["--num_gpus", "3"], "local")):
        assert main([*args, "--dry-run", "--json", "t.py"]) == 0
        assert json.loads(capsys.readouterr().out)["launcher"] == expected, args


def test_filter_errors_reach_the_user(tmp_path: Path) -> None:
    (tmp_path / "hosts").write_text("n1 slots=2\n")
    out = run("-H", "hosts", "--num_nodes", "3", "t.py", cwd=tmp_path)
    assert out.returncode == 1 and "--num_nodes 3 is larger than the 1 node(s) available" in out.stderr


def test_bad_config_stops_the_launch_before_any_rank(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    (tmp_path / "t.py").write_text(f"open({str(marker)!r}, 'w').write('x')\n")
    (tmp_path / "ds.json").write_text(json.dumps({"train_batch_size": 3, "train_micro_batch_size_per_gpu": 2}))
    out = run("--num_gpus", "2", "--config", "ds.json", "t.py", cwd=tmp_path)
    assert out.returncode == 1 and "train_batch_size" in out.stderr and not marker.exists()
    out = run("--num_gpus", "2", "t.py", "--deepspeed_config", "ds.json", cwd=tmp_path)
    assert out.returncode == 1 and "train_batch_size" in out.stderr and not marker.exists()
    out = run("--config", "missing.yaml", "t.py", cwd=tmp_path)
    assert out.returncode == 1 and "--config 'missing.yaml' does not exist" in out.stderr


def test_a_group_size_that_does_not_tile_the_nodes_stops_the_launch(tmp_path: Path) -> None:
    """hpZ's group must lie inside a node and MiCS's divide the world: checked against the plan's nodes."""
    marker = tmp_path / "ran"
    (tmp_path / "t.py").write_text(f"open({str(marker)!r}, 'w').write('x')\n")
    for keys, text in (({"zero_hpz_partition_size": 4}, "zero_hpz_partition_size 4 does not divide the 2 ranks"),
                       ({"mics_shard_size": 3}, "mics_shard_size 3 does not tile a world of 2 ranks")):
        cfg = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3, **keys}}
        (tmp_path / "ds.json").write_text(json.dumps(cfg))
        out = run("--num_gpus", "2", "--config", "ds.json", "t.py", cwd=tmp_path)
        assert out.returncode == 1 and text in out.stderr and "--config ds.json" in out.stderr, out.stderr
        assert not marker.exists()


def test_num_gpus_2_without_gpus_runs_two_cpu_ranks(tmp_path: Path) -> None:
    (tmp_path / "ds.json").write_text(json.dumps({"train_batch_size": 4, "train_micro_batch_size_per_gpu": 2}))
    out = run("--num_gpus", "2", "--config", "ds.json", "--master_port", "auto", "--log_dir", "logs", "--ranks", "1",
              "--pass_local_rank", str(SCRIPTS / "allreduce.py"), "a b", "$HOME", cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "[localhost:1] rank 1/2 local 1 node 0 sum 3 args ['--local_rank=1', 'a b', '$HOME'] cvd None " \
        f"config {tmp_path / 'ds.json'}" in out.stdout
    assert "[localhost:0]" not in out.stdout  # --ranks 1 filters the console, not the logs
    assert "rank 0/2 local 0" in (tmp_path / "logs" / "rank0.log").read_text()
    assert "rank 1/2 local 1" in (tmp_path / "logs" / "rank1.log").read_text()


def test_env_and_gpu_devices_reach_the_ranks(tmp_path: Path) -> None:
    # No GPU here: --devices gpu forces what an agent does on a GPU node (CUDA_VISIBLE_DEVICES = slots).
    (tmp_path / "env.py").write_text(
        "import os\nprint(os.environ['RANK'], os.environ.get('CUDA_VISIBLE_DEVICES'), os.environ['MY_FLAG'],"
        " os.environ['HF_TOKEN'])\n")
    out = run("--num_gpus", "2", "--devices", "gpu", "--env", "MY_FLAG=a=b c", "env.py", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert sorted(out.stdout.splitlines()) == [
        "[localhost:0] 0 0,1 a=b c hf_s3cret_value", "[localhost:1] 1 0,1 a=b c hf_s3cret_value",
    ]
    # a script that never calls the engine still shows in the summary: no steps, its exit status
    rows = [line.split() for line in out.stderr.splitlines() if line.split()[1:2] == ["localhost"]]
    assert rows == [["0", "localhost", "0", "-", "-", "-", "0"], ["1", "localhost", "0", "-", "-", "-", "0"]], out.stderr


def _start_hanging(tmp_path: Path, *extra: str) -> tuple[subprocess.Popen[str], list[int]]:
    pids = tmp_path / "pids"
    pids.mkdir()
    proc = subprocess.Popen(
        zerorun_argv("--num_gpus", "2", "--master_port", "auto", "--kill_timeout", "3",
                     str(SCRIPTS / "hang_or_fail.py"), "--pid_dir", str(pids), "--no_torch", *extra),
        cwd=tmp_path, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    return proc, wait_for_rank_pids(pids, 2, timeout=60, proc=proc)


def test_launcher_killed_agents_take_their_ranks_down(tmp_path: Path) -> None:
    proc, pids = _start_hanging(tmp_path)
    groups = launch_tree(proc.pid) - {os.getpgrp()}  # the agent's group and each rank's
    assert len(groups) == 3
    proc.kill()  # SIGKILL: no handler runs; the agent sees EOF on stdin and its lifeline's SIGTERM
    proc.communicate(timeout=10)
    assert wait_gone(pids, timeout=10) == []
    assert wait_groups_gone(groups, timeout=10) == []


def test_a_killed_agent_takes_its_ranks_along(tmp_path: Path) -> None:
    proc, pids = _start_hanging(tmp_path)
    with open(f"/proc/{pids[0]}/stat") as fh:
        agent = int(fh.read().rsplit(")", 1)[1].split()[1])
    os.kill(agent, signal.SIGKILL)  # the OOM killer picks the agent: its ranks must not train on
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == 137, err
    assert wait_gone(pids, timeout=10) == []
    assert wait_groups_gone(set(pids), timeout=10) == []  # each rank led its own group: nothing of it is left


def test_ctrl_c_stops_every_rank(tmp_path: Path) -> None:
    proc, pids = _start_hanging(tmp_path)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert "forwarding SIGINT" in err
    assert wait_gone(pids, timeout=1) == []


def test_second_ctrl_c_kills_ranks_that_ignore_the_first(tmp_path: Path) -> None:
    proc, pids = _start_hanging(tmp_path, "--ignore_sigint")
    proc.send_signal(signal.SIGINT)
    assert wait_gone(pids, timeout=2) == pids  # forwarded, ignored: the ranks keep running
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert "second Ctrl-C: killing every rank" in err
    assert wait_gone(pids, timeout=1) == []
