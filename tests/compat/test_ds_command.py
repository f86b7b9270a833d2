"""The `deepspeed` and `ds_report` commands (zerorun/compat/ds_command.py, ds_report.py, ds_commands_link.py)
and DeepSpeed's launcher helpers (zerorun/compat/ds_resources.py, multinode_runner.py) with DeepSpeed's
semantics: the same namespaces, the same results, ValueError where DeepSpeed raises it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import OrderedDict
from pathlib import Path

import pytest

from launcher.errors import LaunchError
from launcher.plan.port import free_port
from zerorun.compat import ds_commands_link as links
from zerorun.compat.ds_command import parse_args, translate
from zerorun.compat.ds_resources import (
    apply_num_nodes_and_gpus,
    decode_world_info,
    encode_world_info,
    parse_hostfile_lines,
    parse_inclusion_exclusion,
    parse_range_list,
    parse_resource_filter,
)
from zerorun.errors import ZerorunError

ROOT = Path(__file__).resolve().parents[2]
HOSTS = {"worker-0": [0, 1, 2, 3], "worker-1": [0, 1, 2, 3]}


# -- the launcher grammar ---------------------------------------------------------------------------------

def test_options_end_at_the_script_and_its_arguments_pass_untouched() -> None:
    quoted = ["--prompt", "I'm 6' tall \"really\"", "--x", "$HOME;$(id)", "--num_gpus", "9"]
    ns = parse_args(["--num_gpus", "2", "train.py", *quoted])
    assert (ns.num_gpus, ns.user_script, ns.user_args) == (2, "train.py", quoted)
    argv = translate(["--num_gpus", "2", "train.py", *quoted])
    assert argv == ["--as_deepspeed", "--num_gpus", "2", "train.py", *quoted]
    # a port the user did not name is the launcher's to choose (29500, or a free one when a local job holds it)
    assert translate(["--master_port", "29500", "t.py"])[1:3] == ["--master_port", "29500"]


def test_each_deepspeed_flag_becomes_zerorun_s(tmp_path: Path) -> None:
    hostfile = tmp_path / "hosts"
    hostfile.write_text("worker-0 slots=4\nworker-1 slots=4\n")
    argv = translate(["-H", str(hostfile), "-i", "worker-0:0,1@worker-1", "--master_port", "1234",
                      "--master_addr", "10.0.0.1", "--launcher", "OpenMPI", "--launcher_args", "-x A=1",
                      "--module", "--no_local_rank", "--no_ssh_check", "--bind_cores_to_rank",
                      "--bind_core_list", "0-3", "--enable_each_rank_log", "logs", "--ssh_port", "2222", "pkg.train"])
    assert argv == ["--as_deepspeed", "--hostfile", str(hostfile), "--include", "worker-0:0,1@worker-1",
                    "--master_port", "1234", "--master_addr", "10.0.0.1", "--launcher", "openmpi",
                    "--launcher_args", "-x A=1", "--ssh_port", "2222", "-m", "--no_local_rank", "--no_ssh_check",
                    "--bind_cores_to_rank", "--bind_core_list", "0-3", "--log_dir", "logs", "pkg.train"]


def test_one_host_runs_without_a_multi_node_runner_unless_forced(tmp_path: Path) -> None:
    (tmp_path / "one").write_text("localhost slots=2\n")
    assert "--launcher" not in translate(["-H", str(tmp_path / "one"), "--launcher", "pdsh", "t.py"])
    assert translate(["--force_multi", "t.py"])[-3:] == ["--launcher", "pdsh", "t.py"]
    with pytest.raises(LaunchError, match="does not exist"):  # stricter than DeepSpeed's silent local fallback
        translate(["-H", str(tmp_path / "missing"), "t.py"])


@pytest.mark.parametrize("args", ["--num_nodes 1 -i localhost foo.py", "--num_nodes 1 --num_gpus 1 -i localhost foo.py",
                                  "--num_gpus 1 -i localhost foo.py", "--num_nodes 1 -e localhost foo.py",
                                  "--num_gpus 1 -e localhost foo.py", "--bind_core_list 4,1-2 foo.py"])
def test_deepspeed_s_value_errors(args: str) -> None:
    with pytest.raises(ValueError):
        translate(args.split())


@pytest.mark.parametrize(("args", "says"), [("--no_ssh --node_rank 0 t.py", "--no_ssh"),
                                            ("--autotuning tune t.py", "zerorun autotune"),
                                            ("--launcher mvapich t.py", "MVAPICH"),
                                            ("--launcher nosuch t.py", "not a launcher"),
                                            ("--venv_script act.sh t.py", "--venv_script")])
def test_features_zerorun_lacks_are_refused_with_the_way_to_do_it(args: str, says: str) -> None:
    with pytest.raises(LaunchError) as err:
        translate(args.split())
    assert says in str(err.value) and err.value.hint


# -- the resource helpers ---------------------------------------------------------------------------------

def test_hostfile_lines_with_deepspeed_s_errors() -> None:
    good = ["", "  worker-1 slots=2", "123.23.12.10 slots=2", "  # worker-1 slots=3", "localhost slots=1"]
    assert parse_hostfile_lines(good) == OrderedDict([("worker-1", 2), ("123.23.12.10", 2), ("localhost", 1)])
    for bad in (["w1 slots=2", "w1 slots=1"], ["w1 slots=two"], ["# only a comment", ""]):
        with pytest.raises(ValueError):
            parse_hostfile_lines(bad)


@pytest.mark.parametrize(("include", "exclude", "expected"), [
    ("", "", HOSTS),
    ("worker-1:0,3", "", {"worker-1": [0, 3]}),
    ("worker-0:1@worker-0:0,1", "", {"worker-0": [0, 1]}),
    ("worker-0", "", {"worker-0": [0, 1, 2, 3]}),
    ("", "worker-1", {"worker-0": [0, 1, 2, 3]}),
    ("", "worker-0:0,1@worker-1:3", {"worker-0": [2, 3], "worker-1": [0, 1, 2]}),
    ("", "worker-0@worker-1", {}),
])
def test_resource_filter_matches_deepspeed(include: str, exclude: str, expected: dict) -> None:
    assert dict(parse_resource_filter(HOSTS, include, exclude)) == expected


@pytest.mark.parametrize(("include", "exclude"), [("A", "B"), ("jeff", ""), ("", "jeff"), ("worker-1:4", ""),
                                                  ("", "worker-1:4"), ("", "worker-1@worker-0:1@5"), ("w:x", "")])
def test_resource_filter_errors_are_value_errors(include: str, exclude: str) -> None:
    with pytest.raises(ValueError):
        parse_resource_filter(HOSTS, include, exclude)


def test_counts_to_slots_then_top_nodes_and_gpus() -> None:
    active = parse_inclusion_exclusion({"a": 2, "b": 4}, "", "b:0")
    assert dict(active) == {"a": [0, 1], "b": [1, 2, 3]}
    assert dict(apply_num_nodes_and_gpus(active, 1, -1)) == {"a": [0, 1]}
    assert dict(apply_num_nodes_and_gpus(active, -1, 1)) == {"a": [0], "b": [0]}


def test_world_info_round_trips_and_refuses_other_shapes() -> None:
    assert decode_world_info(encode_world_info(HOSTS)) == HOSTS
    with pytest.raises(ValueError):
        decode_world_info(encode_world_info({"a": ["0"]}))  # type: ignore[dict-item]
    with pytest.raises(ValueError):
        decode_world_info("not base64 json")


def test_core_lists_ascend_without_overlap() -> None:
    assert parse_range_list("0,2-4,6,8-9") == [0, 2, 3, 4, 6, 8, 9]
    for bad in ("0,2-6,5-9", "8,2-6", "1,6-2", "a", "1-"):
        with pytest.raises(ValueError):
            parse_range_list(bad)


def test_multinode_runner_base_quotes_exports_as_deepspeed_does() -> None:
    from types import SimpleNamespace

    from zerorun.compat.multinode_runner import MultiNodeRunner, PDSHRunner

    class Runner(MultiNodeRunner):
        def backend_exists(self) -> bool:
            return True

        def get_cmd(self, environment: dict[str, str], active_resources: object) -> list[str]:
            return []

    runner = Runner(SimpleNamespace(user_args=[], user_script="s.py"), "info")
    runner.add_export("SLURM_JOB_CPUS_PER_NODE", "64(x2)")
    runner.add_export(" PYTHONPATH ", "/usr/lib/python3/site-packages ")
    assert runner.exports == {"SLURM_JOB_CPUS_PER_NODE": '"64(x2)"', "PYTHONPATH": "/usr/lib/python3/site-packages"}
    with pytest.raises(ZerorunError, match="PDSH runner"):
        PDSHRunner(SimpleNamespace(user_args=[], user_script="s.py"), "info")


# -- the commands in an environment -----------------------------------------------------------------------

def test_link_writes_both_commands_and_refuses_what_is_not_its_own(tmp_path: Path) -> None:
    written = links.link(tmp_path, python=sys.executable, path=[])
    assert sorted(p.name for p in written) == ["deepspeed", "ds_report"]
    assert all(os.access(p, os.X_OK) and links.is_ours(p) for p in written)
    assert links.link(tmp_path, python=sys.executable, path=[]) == written  # again: replaces its own
    (tmp_path / "ds_report").write_text("#!/bin/sh\necho someone else's\n")
    with pytest.raises(ZerorunError, match="not zerorun's"):
        links.link(tmp_path, python=sys.executable, path=[])
    assert links.unlink(tmp_path) == [tmp_path / "deepspeed"]
    assert (tmp_path / "ds_report").exists()  # not ours: left alone


def test_link_refuses_where_a_real_deepspeed_is_installed(tmp_path: Path) -> None:
    site = tmp_path / "site"
    (site / "deepspeed").mkdir(parents=True)
    (site / "deepspeed" / "__init__.py").write_text("")
    (tmp_path / "bin").mkdir()
    with pytest.raises(ZerorunError, match="real DeepSpeed is installed"):
        links.link(tmp_path / "bin", path=[str(site)])
    assert list((tmp_path / "bin").iterdir()) == []


ARGV_PROBE = """\
import json, os, sys
import deepspeed
with open(f"rank{os.environ['RANK']}.json", "w") as fh:
    json.dump({"argv": sys.argv[1:], "deepspeed": deepspeed.__version__}, fh)
"""


def test_the_deepspeed_command_runs_the_example_through_zerorun(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    links.link(bin_dir, python=sys.executable, path=[])
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    env.pop("ZERORUN_AS_DEEPSPEED", None)
    (tmp_path / "probe.py").write_text(ARGV_PROBE)
    prompt = "I'm going to tell them \"DeepSpeed is the best\" $HOME"
    probe = subprocess.run(["deepspeed", "--num_gpus", "1", "--master_port", str(free_port()), "probe.py", "--prompt", prompt],
                           cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert probe.returncode == 0, probe.stderr
    seen = json.loads((tmp_path / "rank0.json").read_text())
    assert seen == {"argv": ["--local_rank=0", "--prompt", prompt], "deepspeed": "0.19.8+zerorun"}
    toy = subprocess.run(["deepspeed", "--num_gpus", "2", "--master_port", str(free_port()), str(ROOT / "examples/train_toy.py"),
                          "--steps", "2", "--layers", "2", "--deepspeed", "--deepspeed_config",
                          str(ROOT / "templates/zero2.yaml")], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=180)
    assert toy.returncode == 0, toy.stderr
    assert "ZeRO stage 2" in toy.stdout and "2 ranks" in toy.stdout
    report = subprocess.run(["ds_report"], env=env, capture_output=True, text=True, timeout=60)
    assert report.returncode == 0 and "0.19.8+zerorun" in report.stdout


def test_a_deepspeed_value_error_is_one_error_line() -> None:
    proc = subprocess.run([sys.executable, "-c", "import sys; from zerorun.compat.ds_command import main; "
                           "sys.exit(main())", "--num_gpus", "1", "-i", "localhost", "t.py"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "error: Cannot specify num_nodes/gpus with include/exclude" in proc.stderr
