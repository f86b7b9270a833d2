"""launcher/plan/runners.py, envpolicy.py, shim.py, preflight.py: exact argv of every runner,
quoting round trips through a real shell, env-file parsing, the srun/mpirun rank map."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.doctor.preflight import TAG, HostCheck, check_argv, judge
from launcher.errors import EnvFileError, LaunchError
from launcher.plan.envpolicy import (
    collect_env,
    default_env_files,
    parse_env_file,
    parse_env_items,
    select_exported,
)
from launcher.plan.filters import select
from launcher.plan.hostfile import parse_hostfile
from launcher.plan.launch_plan import LaunchPlan, build_plan
from launcher.plan.runners import (
    PayloadMode,
    RunnerKind,
    SshOptions,
    build_commands,
    check_mpirun_as_root,
    remote_shell_command,
)
from launcher.run.shim import host_name, rank_vars

TRICKY = ["a b", "it's", 'say "hi"', "$HOME", "`id`", "100%", "%h", "x;y", "", "new\nline", "--lr=1e-3"]


def _plan(text: str = "n1 slots=2\nu@n2 slots=2\n", cwd: str = "/work dir", **kw: object) -> LaunchPlan:
    return build_plan(select(parse_hostfile(text)), command=["/py", "-u", "t.py", "--x", "1"], job_id="J",
                      cwd=cwd, python="/py", env={"HF_TOKEN": "s3cret"}, **kw)  # type: ignore[arg-type]


SSH = SshOptions(port=2222, args=("-F", "my conf", "-i", "key"))


def test_local_runner_argv() -> None:
    plan = _plan("localhost slots=2\n")
    [cmd] = build_commands(plan, RunnerKind.LOCAL)
    assert cmd.argv == ("/py", "-u", "-m", "launcher.run.agent", "--node_rank", "0")
    assert cmd.payload is PayloadMode.STDIN
    with pytest.raises(LaunchError, match="--launcher local runs one node, the plan has 2"):
        build_commands(_plan(), RunnerKind.LOCAL)


def test_ssh_runner_argv_has_explicit_node_rank_and_no_values() -> None:
    cmds = build_commands(_plan(), RunnerKind.SSH, SSH)
    assert [c.argv for c in cmds] == [
        ("ssh", "-T", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10", "-p", "2222", "-F", "my conf", "-i", "key",
         "--", "n1", "cd '/work dir' && exec /py -u -m launcher.run.agent --node_rank 0"),
        ("ssh", "-T", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10", "-p", "2222", "-F", "my conf", "-i", "key",
         "--", "u@n2", "cd '/work dir' && exec /py -u -m launcher.run.agent --node_rank 1"),
    ]
    assert all(c.payload is PayloadMode.STDIN for c in cmds)
    assert "s3cret" not in json.dumps([c.argv for c in cmds])


def test_pdsh_runner_argv_env_and_payload_files() -> None:
    cmds = build_commands(_plan(cwd="/w/100%"), RunnerKind.PDSH, SSH, payload_dir="/w/.zerorun/J", launcher_args=("-u", "30"))
    assert cmds[1].argv == (
        "pdsh", "-S", "-N", "-R", "ssh", "-f", "1", "-u", "30", "-w", "u@n2",
        "cd /w/100%% && exec /py -u -m launcher.run.agent --node_rank 1 --payload /w/.zerorun/J/node1.json",
    )
    assert cmds[1].payload is PayloadMode.FILE and cmds[1].payload_path == "/w/.zerorun/J/node1.json"
    assert dict(cmds[0].env) == {
        "PDSH_RCMD_TYPE": "ssh", "PDSH_SSH_ARGS": "-2 -a -x -l%u -- %h",
        "PDSH_SSH_ARGS_APPEND": "-o BatchMode=yes -o ConnectTimeout=10 -p 2222 -F 'my conf' -i key",
    }


def test_slurm_runner_argv() -> None:
    [cmd] = build_commands(_plan(pass_local_rank=True), RunnerKind.SLURM, launcher_args=("--partition", "gpu"))
    assert cmd.argv == (
        "srun", "--kill-on-bad-exit=1", "--nodes=2", "--ntasks=4", "--ntasks-per-node=2", "--nodelist=n1,n2",
        "--export=ALL", "--partition", "gpu", "/py", "-u", "-m", "launcher.run.shim", "--pass_local_rank", "--",
        "/py", "-u", "t.py", "--x", "1",
    )
    env = dict(cmd.env)
    assert (env["MASTER_ADDR"], env["MASTER_PORT"], env["HF_TOKEN"]) == ("n1", "29500", "s3cret")
    with pytest.raises(LaunchError, match=r"needs the same number of ranks on every node, got \[1, 2\]"):
        build_commands(_plan("a slots=1\nb slots=2\n"), RunnerKind.SLURM)


def test_openmpi_runner_exports_names_not_values() -> None:
    [cmd] = build_commands(_plan("a slots=1\nb slots=3\n"), RunnerKind.OPENMPI, SSH)
    assert cmd.argv == (
        "mpirun", "-np", "4", "--host", "a:1,b:3", "--bind-to", "none", "--wdir", "/work dir",
        "--mca", "plm_rsh_args", "-o BatchMode=yes -o ConnectTimeout=10 -p 2222 -F my conf -i key",
        "-x", "HF_TOKEN", "-x", "MASTER_ADDR", "-x", "MASTER_PORT", "-x", "PYTHONUNBUFFERED", "-x", "ZERORUN_CHANNEL_KEY", "-x", "ZERORUN_JOB_ID",
        "-x", "ZERORUN_KILL_TIMEOUT", "-x", "ZERORUN_NODES",
        "/py", "-u", "-m", "launcher.run.shim", "--", "/py", "-u", "t.py", "--x", "1",
    )
    env = dict(cmd.env)
    assert "s3cret" not in cmd.argv and env["HF_TOKEN"] == "s3cret"
    assert (env["ZERORUN_NODES"], env["ZERORUN_KILL_TIMEOUT"]) == ("a:1,b:3", "10.0")


def test_mpirun_as_root_needs_an_explicit_allowance() -> None:
    with pytest.raises(LaunchError, match="mpirun refuses to run as root") as err:
        check_mpirun_as_root((), {}, euid=0)
    assert "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1" in err.value.hint
    check_mpirun_as_root(("--allow-run-as-root",), {}, euid=0)
    check_mpirun_as_root((), {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}, euid=0)
    check_mpirun_as_root((), {}, euid=1000)


def test_remote_command_round_trips_through_a_real_shell(tmp_path: Path) -> None:
    weird_dir = tmp_path / "dir with 'quote' $x"
    weird_dir.mkdir()
    plan = _plan(cwd=str(weird_dir))
    argv = [sys.executable, "-c", "import json,os,sys; print(json.dumps([os.getcwd(), *sys.argv[1:]]))", *TRICKY]
    out = subprocess.run(["sh", "-c", remote_shell_command(plan, argv)], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == [str(weird_dir), *TRICKY]


def test_ssh_target_strips_ipv6_brackets() -> None:
    [cmd] = build_commands(_plan("root@[fe80::1] slots=1\n"), RunnerKind.SSH)
    assert cmd.argv[-2] == "root@fe80::1"


def test_env_file_parser() -> None:
    text = "\n".join([
        "# a comment", "", "export NCCL_DEBUG=INFO", "PLAIN = spaced value  # trailing", 'DQ="a \\"b\\" $c # no"',
        "SQ='lit $x \"y\"'  # ok", "EQ=a=b=c", "EMPTY=", "HASH=a#b", "",
    ])
    assert parse_env_file(text, "f") == {
        "NCCL_DEBUG": "INFO", "PLAIN": "spaced value", "DQ": 'a "b" $c # no', "SQ": 'lit $x "y"',
        "EQ": "a=b=c", "EMPTY": "", "HASH": "a#b",
    }


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("OK=1\nnot a pair\n", "f:2: expected KEY=VALUE, got 'not a pair'"),
        ("1BAD=x\n", "f:1: expected KEY=VALUE"),
        ('Q="open\n', "f:1: unterminated double quote"),
        ("Q='open\n", "f:1: unterminated single quote"),
        ('Q="a" b\n', "f:1: text 'b' after the closing quote"),
    ],
)
def test_env_file_errors(text: str, needle: str) -> None:
    with pytest.raises(EnvFileError) as info:
        parse_env_file(text, "f")
    assert needle in info.value.message


def test_export_policy_prefixes_files_and_flags(tmp_path: Path) -> None:
    environ = {"NCCL_IB_HCA": "mlx5", "PYTHONPATH": "/p", "HOME": "/root", "SECRET": "x", "CUDA_VISIBLE_DEVICES": "0",
               "WANDB_API_KEY": "k", "LD_LIBRARY_PATH": "/l", "ZERORUN_SSH_ARGS": "-i k", "OMP_NUM_THREADS": "4"}
    assert select_exported(environ) == {"NCCL_IB_HCA": "mlx5", "PYTHONPATH": "/p", "WANDB_API_KEY": "k",
                                        "LD_LIBRARY_PATH": "/l", "OMP_NUM_THREADS": "4"}
    home, cwd = tmp_path / "home", tmp_path / "cwd"
    home.mkdir(), cwd.mkdir()
    (home / ".deepspeed_env").write_text("A=home-ds\nB=home-ds\n")
    (cwd / ".zerorun_env").write_text("# here\nB=cwd-zr\nC=cwd-zr\n")
    explicit = tmp_path / "extra.env"
    explicit.write_text("C=explicit\n")
    env = collect_env(environ, default_env_files(cwd, home), ["C=flag", "D=x=y"], explicit)
    assert {k: env[k] for k in "ABCD"} == {"A": "home-ds", "B": "cwd-zr", "C": "flag", "D": "x=y"}
    with pytest.raises(EnvFileError, match="--env 'NOEQUALS': expected KEY=VALUE"):
        parse_env_items(["NOEQUALS"])
    with pytest.raises(EnvFileError, match="--env_file .* does not exist"):
        collect_env({}, [], [], tmp_path / "missing.env")


def test_shim_maps_slurm_and_openmpi_variables() -> None:
    slurm = rank_vars({"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1", "SLURM_NODEID": "2",
                       "SLURM_TASKS_PER_NODE": "2(x4)"})
    assert slurm == {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "NODE_RANK": "2",
                     "LOCAL_SIZE": "2", "GROUP_RANK": "2", "CROSS_RANK": "2"}
    ompi = rank_vars({"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
                      "OMPI_COMM_WORLD_LOCAL_SIZE": "2", "OMPI_COMM_WORLD_NODE_RANK": "1"})
    assert (ompi["RANK"], ompi["LOCAL_RANK"], ompi["NODE_RANK"], ompi["LOCAL_WORLD_SIZE"]) == ("3", "1", "1", "2")
    # OMPI_COMM_WORLD_NODE_RANK is a rank *on* the node; the node comes from the plan's layout
    uneven = {"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "2",
              "OMPI_COMM_WORLD_LOCAL_SIZE": "3", "OMPI_COMM_WORLD_NODE_RANK": "2", "ZERORUN_NODES": "a:1,[::1]:3"}
    assert rank_vars(uneven)["NODE_RANK"] == "1"
    assert host_name({**uneven, "NODE_RANK": "1"}) == "[::1]"
    with pytest.raises(LaunchError, match="neither SLURM_PROCID nor OMPI_COMM_WORLD_RANK"):
        rank_vars({})


def test_preflight_argv_and_verdicts() -> None:
    argv = check_argv(_plan(), "u@n2", SshOptions())
    assert argv[:6] == ["ssh", "-T", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10"] and argv[6:8] == ["--", "u@n2"]
    assert argv[8].startswith("test -d '/work dir' || ") and shlex.split(argv[8])
    expected = ("3.11.7", "0.1.0")
    assert judge(HostCheck("n1", 0, f"{TAG} 3.11.7 0.1.0\n", ""), expected) is None
    assert "is not reachable over ssh:\n    Permission denied (publickey)." in str(
        judge(HostCheck("n1", 255, "", "Permission denied (publickey).\n"), expected))
    assert "n1 runs Python 3.10.1 / zerorun 0.1.0" in str(judge(HostCheck("n1", 0, f"{TAG} 3.10.1 0.1.0", ""), expected))
    assert "working directory" in str(judge(HostCheck("n1", 3, "", f"{TAG}: working directory /x does not exist"), expected))
