"""The second hour of a new user: a second job on the machine (the port), a launcher option after
the script, the doctor's spelling of --num_gpus."""

from __future__ import annotations

import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from launcher_conftest import SCRIPTS, zerorun_argv

import launcher.plan.port as port_mod
from launcher.errors import LaunchError
from launcher.plan.port import choose_port, in_use


@pytest.fixture
def held_port() -> Iterator[int]:
    """A port some other job's store listens on."""
    with socket.socket() as busy:
        busy.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        busy.bind(("", 0))
        busy.listen()
        yield busy.getsockname()[1]


def test_a_held_port_is_in_use_and_a_closed_one_is_not(held_port: int) -> None:
    assert in_use(held_port)
    with socket.socket() as s:
        s.bind(("", 0))
        closed = s.getsockname()[1]
    assert not in_use(closed)


def test_default_port_taken_here_takes_a_free_one_and_says_so(held_port: int, monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(port_mod, "DEFAULT_MASTER_PORT", held_port)
    port, reason = choose_port(None, here=True)
    assert port != held_port and not in_use(port) and reason and str(held_port) in reason
    said = capsys.readouterr().err
    assert f"port {held_port} is in use" in said and f"free port {port}" in said and said.count("\n") == 1
    assert choose_port(None, here=False) == (held_port, None)  # another node's port: only the preflight can tell


def test_a_free_port_is_outside_the_range_of_outgoing_connections(monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernel's pick for port 0 comes from the range it gives outgoing connections, where any
    connection opened before the store listens can take it: the launcher's pick lies outside it."""
    outgoing = port_mod.outgoing_ports()
    picks = {port_mod.free_port() for _ in range(20)}
    assert all(p not in outgoing and 1024 <= p < 65536 and not in_use(p) for p in picks), (picks, outgoing)
    assert len(picks) > 1  # random, not one port every job on the machine would race for
    monkeypatch.setattr(port_mod, "in_use", lambda port: True)  # every candidate taken: the kernel's pick
    assert port_mod.free_port(tries=3) in outgoing


def test_default_port_free_stays_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as s:
        s.bind(("", 0))
        free = s.getsockname()[1]
    monkeypatch.setattr(port_mod, "DEFAULT_MASTER_PORT", free)
    assert choose_port(None, here=True) == (free, None)


def test_a_named_port_taken_here_stops_in_one_line_with_the_fix(held_port: int) -> None:
    with pytest.raises(LaunchError) as err:
        choose_port(str(held_port), here=True)
    assert f"--master_port {held_port} is in use on this machine" in err.value.message
    assert "drop --master_port" in (err.value.hint or "")
    assert choose_port(str(held_port), here=True, check=False) == (held_port, None)  # dry run, doctor


def test_a_taken_port_stops_the_launch_before_any_rank(held_port: int, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    script = tmp_path / "t.py"
    script.write_text(f"open({str(marker)!r}, 'w').close()\n")
    out = subprocess.run(zerorun_argv("--num_gpus", "2", "--master_port", str(held_port), str(script)),
                         cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert out.returncode == 1, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) <= 5 and "Traceback" not in out.stderr and str(held_port) in lines[0], out.stderr
    assert not marker.exists()


def test_with_the_default_port_taken_the_job_trains(held_port: int, monkeypatch: pytest.MonkeyPatch,
                                                   tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    from launcher.main import main

    monkeypatch.setattr(port_mod, "DEFAULT_MASTER_PORT", held_port)
    monkeypatch.chdir(tmp_path)
    assert main(["--num_gpus", "2", "-q", str(SCRIPTS / "allreduce.py")]) == 0
    out, err = capfd.readouterr()
    assert out.count("sum 3") == 2 and f"port {held_port} is in use" in err, out + err


@pytest.mark.parametrize("spelling", ["--num_gpus", "--num-gpus", "--gpus"])
def test_doctor_takes_the_launchers_num_gpus(spelling: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from zerorun.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(["doctor", spelling, "2", "--json"]) == 0, capsys.readouterr()
    data = json.loads(capsys.readouterr().out)
    assert data["ok"] and [h["slots"] for h in data["hosts"]] == [2]


def _launch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str],
            script: str, *argv: str) -> tuple[int, str]:
    from launcher.main import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.py").write_text(script)
    code = main(["--master_port", "auto", *argv])
    return code, capfd.readouterr().err


VALUE_ERROR = """import os
def check(lr):
    if os.environ["RANK"] == "1":
        raise ValueError(f"bad lr: {lr} (must be < 1)")
check(3.0)
"""


def test_the_root_cause_box_quotes_a_ranks_exception(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     capfd: pytest.CaptureFixture[str]) -> None:
    code, err = _launch(tmp_path, monkeypatch, capfd, VALUE_ERROR, "--num_gpus", "2", "t.py")
    box = err[err.index("Root cause"):]
    assert code == 1
    assert "  error     : ValueError: bad lr: 3.0 (must be < 1)\n" in box, err
    assert "  raised at : t.py:4 in check (traceback" in box, err  # the script raised it: no "(from ...)"
    assert "(traceback above, by rank(s) 1)" in box, err


ARGPARSE = """import argparse
p = argparse.ArgumentParser()
p.add_argument("--lr", type=float)
p.add_argument("--local_rank", type=int)
p.parse_args()
"""


def test_a_launcher_option_after_the_script_is_named_when_the_script_refuses_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> None:
    code, err = _launch(tmp_path, monkeypatch, capfd, ARGPARSE, "t.py", "--lr", "1", "--num_gpus", "2")
    assert code == 2
    assert ("hint      : --num_gpus went to the script (everything after the script is the script's); launcher "
            "options go before it: zerorun --master_port auto --num_gpus 2 t.py --lr 1") in err, err


def test_a_script_that_takes_the_launchers_flag_keeps_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         capfd: pytest.CaptureFixture[str]) -> None:
    script = ARGPARSE.replace('p.add_argument("--lr"', 'p.add_argument("--num_gpus", type=int)\np.add_argument("--lr"')
    code, err = _launch(tmp_path, monkeypatch, capfd, script + "import sys; sys.exit(3)\n", "t.py", "--num_gpus", "2")
    assert code == 3 and "launcher options go before" not in err, err
