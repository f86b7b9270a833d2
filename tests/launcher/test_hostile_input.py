"""Hostile hosts, working directories and ranges: a host is never read as an option,
every string a remote shell reads is quoted, every range is bounded before it is
expanded, and every bad hostfile line is reported in one pass."""

from __future__ import annotations

import resource
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest
from launcher_conftest import zerorun_argv

from launcher.args import parse_rank_list
from launcher.doctor.preflight import TAG, check_argv
from launcher.errors import FilterError, HostfileError, LaunchError
from launcher.plan.affinity import parse_core_list
from launcher.plan.filters import parse_filter, select
from launcher.plan.hostfile import Host, parse_hostfile
from launcher.plan.launch_plan import build_plan
from launcher.plan.runners import RunnerKind, SshOptions, build_commands

EVIL_HOSTS = ["-Fevil", "-Jjump", "-Elog", "-oProxyCommand=sh", "bob@-F", "-bob@w1", "a;b", "$(id)", "w`id`",
              "[not:an:ipv6:at:all:x:y:z]", "[-F]", "999.1.1.1", "-", "w1..w2", "w1-", "x" * 300]
HOSTILE_CWD = "/tmp/bob's \"run\" $(id >pwned) ;touch pwned2 && `id` 100%h"
ODD_HOSTS = "node-1.example slots=2\nu_1@[fe80::1%eth0] slots=2\n"


@pytest.mark.parametrize("host", EVIL_HOSTS)
def test_a_hostile_host_is_refused_with_its_line(host: str) -> None:
    with pytest.raises(HostfileError) as info:
        parse_hostfile(f"ok slots=1\n{host} slots=2\n", "hf")
    assert info.value.message.startswith(f"hf:2: bad host {host[:80]!r}")


def test_every_bad_line_is_reported_in_one_pass() -> None:
    text = "w0 slots=1\n-Fevil slots=2\nw2 slots=0\nw3\nw0 slots=1\nw5 slots=8000000000\nw6 slots=" + "9" * 5000 + "\n"
    with pytest.raises(HostfileError) as info:
        parse_hostfile(text, "hf")
    lines = [line for line in info.value.message.splitlines() if line.startswith("hf:")]
    assert [line.split(":")[1] for line in lines] == ["2", "3", "4", "5", "6", "7"]
    assert info.value.message.count("\n  fix: ") == 6 and "6 bad lines" in str(info.value.hint)
    assert "more than the 4096 slots a host may have" in lines[4]


@pytest.mark.parametrize("flag", ["--include", "--exclude"])
def test_filters_check_the_host_grammar(flag: str) -> None:
    hosts = parse_hostfile("w1 slots=2\n")
    for spec in ("-Fevil", "w1@-Jjump:0", "[zz]:0"):
        with pytest.raises(FilterError, match="bad host"):
            select(hosts, **{flag[2:]: spec})
    with pytest.raises(LaunchError, match="--master_addr '-Fx'"):
        build_plan(select(hosts), command=["x"], job_id="j", cwd="/", python="p", master_addr="-Fx")


def test_ranges_are_bounded_before_they_are_expanded() -> None:
    started = time.monotonic()
    with pytest.raises(HostfileError, match="slots=8000000000 in 'w1 slots=8000000000' is more than"):
        parse_hostfile("w1 slots=8000000000\n", "hf")
    hosts = parse_hostfile("w1 slots=8\n")
    for spec in ("w1:0-99999999999", "w1:99999999999", "w1:0-" + "9" * 5000):
        with pytest.raises(FilterError, match="past the 4096 slots"):
            parse_filter(spec)
        with pytest.raises(FilterError, match="past the 4096 slots"):
            select(hosts, exclude=spec)
    with pytest.raises(FilterError, match="with 8000000000 slots: a host has 1 to 4096"):
        select((Host("localhost", 8_000_000_000),))
    with pytest.raises(LaunchError, match="bad item"):
        parse_rank_list("0-99999999999")
    with pytest.raises(LaunchError, match="bad item"):
        parse_core_list("0-99999999999")
    assert time.monotonic() - started < 2


def _at_most_2_gib() -> None:  # an unbounded expansion fails fast here instead of taking the machine's memory
    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))


@pytest.mark.parametrize(("args", "needle"), [
    (["--num_gpus", "8000000000"], "a host has 1 to 4096"),
    (["-H", "hf", "-i", "w1:0-99999999999"], "past the 4096 slots a host may have"),
    (["-H", "hf", "--ranks", "0-99999999999"], "--ranks '0-99999999999': bad item"),
    (["-H", "big"], "big:1: slots=8000000000 in 'w1 slots=8000000000' is more than the 4096"),
])
def test_huge_ranges_are_a_clear_error_through_the_cli(tmp_path: Path, args: list[str], needle: str) -> None:
    (tmp_path / "hf").write_text("w1 slots=8\n")
    (tmp_path / "big").write_text("w1 slots=8000000000\n")
    out = subprocess.run(zerorun_argv(*args, "--launcher", "ssh", "--dry-run", "t.py"), cwd=tmp_path,
                         capture_output=True, text=True, timeout=60, preexec_fn=_at_most_2_gib)
    assert out.returncode == 1 and needle in out.stderr and "Traceback" not in out.stderr, out.stderr


def _plan(cwd: str = HOSTILE_CWD, python: str = "/py"):  # type: ignore[no-untyped-def]
    return build_plan(select(parse_hostfile(ODD_HOSTS)), command=["/py", "t.py", "$(id)"], job_id="J", cwd=cwd,
                      python=python)


def _sh_n(text: str) -> None:
    done = subprocess.run(["sh", "-n", "-c", text], capture_output=True, text=True)
    assert done.returncode == 0, (text, done.stderr)


@pytest.mark.parametrize("kind", list(RunnerKind))
def test_every_runner_quotes_a_hostile_cwd(kind: RunnerKind) -> None:
    plan = _plan()
    if kind is RunnerKind.LOCAL:
        plan = build_plan(select(parse_hostfile("localhost slots=1\n")), command=["x"], job_id="J", cwd=HOSTILE_CWD,
                          python="/py")
    cmds = build_commands(plan, kind, SshOptions(port=22), payload_dir=f"{HOSTILE_CWD}/.zerorun/J")
    for cmd in cmds:
        _sh_n(shlex.join(cmd.argv))  # the dry run's copy-paste line
        assert shlex.split(shlex.join(cmd.argv)) == list(cmd.argv)
        if kind is RunnerKind.SSH:
            assert cmd.argv[-3] == "--" and not cmd.argv[-2].startswith("-")
        if kind in (RunnerKind.SSH, RunnerKind.PDSH):  # the one string a remote shell reads
            remote = cmd.argv[-1].replace("%%", "%") if kind is RunnerKind.PDSH else cmd.argv[-1]
            _sh_n(remote)
            assert shlex.split(remote)[:3] == ["cd", HOSTILE_CWD, "&&"]
        if kind is RunnerKind.PDSH:
            assert dict(cmd.env)["PDSH_SSH_ARGS"].endswith("-- %h")
    _sh_n(check_argv(plan, plan.nodes[-1].host, SshOptions())[-1])


def test_a_host_that_skipped_the_parser_is_still_no_option() -> None:
    plan = build_plan(select((Host("-Fevil", 1), Host("-oProxyCommand=sh", 1))), command=["x"], job_id="J", cwd="/w",
                      python="/py")
    for cmd in build_commands(plan, RunnerKind.SSH):
        assert cmd.argv[-3] == "--" and cmd.argv[-2].startswith("-")
    assert check_argv(plan, "-Fevil", SshOptions())[-3:-1] == ["--", "-Fevil"]
    assert all(dict(c.env)["PDSH_SSH_ARGS"].endswith("-- %h") for c in build_commands(plan, RunnerKind.PDSH))


def test_the_remote_strings_run_in_a_hostile_cwd_and_run_nothing_else(tmp_path: Path) -> None:
    cwd = tmp_path / "bob's \"run\" $(id >pwned) ;touch pwned2 && `id` 100%h"
    cwd.mkdir()
    plan = _plan(str(cwd), python=sys.executable)
    for kind in (RunnerKind.SSH, RunnerKind.PDSH):
        remote = build_commands(plan, kind, payload_dir="/p")[0].argv[-1]
        remote = remote.replace("%%", "%") if kind is RunnerKind.PDSH else remote
        remote = remote.replace("exec ", "exec /bin/echo ", 1).replace("&& exec", "&& pwd && exec")
        out = subprocess.run(["sh", "-c", remote], cwd=tmp_path, capture_output=True, text=True, timeout=10)
        assert out.returncode == 0 and out.stdout.splitlines()[0] == str(cwd), out.stderr
    probe = subprocess.run(["sh", "-c", check_argv(plan, "n", SshOptions())[-1]], cwd=tmp_path, capture_output=True,
                           text=True, timeout=30)
    assert probe.returncode == 0 and probe.stdout.startswith(TAG), probe.stderr
    gone = _plan(str(cwd / "missing"), python=sys.executable)
    probe = subprocess.run(["sh", "-c", check_argv(gone, "n", SshOptions())[-1]], cwd=tmp_path, capture_output=True,
                           text=True, timeout=30)
    assert probe.returncode == 3 and f"working directory {cwd / 'missing'} does not exist" in probe.stderr
    for where in (tmp_path, cwd):
        assert not (where / "pwned").exists() and not (where / "pwned2").exists()
