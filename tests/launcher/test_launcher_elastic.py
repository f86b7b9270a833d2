"""``--nnodes 2:3 --rejoin``: a lost node costs one restart; the batch and the data order survive.

Three "nodes" (the test's sshd on 127.0.0.2-4, one gloo rank each) train a tiny ZeRO-2 model
with a global batch of 12 (accumulation 2 at world 3, 3 at world 2) over 48 samples with ids,
a checkpoint every 2 steps. Rank 2 (node 127.0.0.4) SIGKILLs itself after step 3: the launcher
drops that node and restarts at world 2 from step 2's checkpoint. There rank 1 (127.0.0.3)
SIGKILLs itself after step 5: at that restart 127.0.0.4 answers the checks and rejoins
(--rejoin), 127.0.0.3 sits out, the run resumes from step 4 and ends with rc 0. Every sample
id is consumed exactly once per epoch (counting each attempt up to the checkpoint the next
resumed from), every step is 12 samples, and the losses after the 3 -> 2 restart equal those
of a run that went from world 3 to 2 on purpose from the same checkpoint.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest
from launcher_conftest import NODES, SCRIPTS, THIRD, SshServer, sshd, zerorun_argv  # noqa: F401

from launcher.elastic.membership import Membership, NodeRange, change_line, parse_nnodes
from launcher.plan.filters import NodeSlots
from launcher.plan.hostfile import Host


def _records(log: Path) -> list[dict]:
    return [json.loads(line) for f in sorted(log.glob("rank*.jsonl")) for line in f.read_text().splitlines()]


def _finish(proc: subprocess.Popen[str]) -> subprocess.CompletedProcess[str]:
    try:
        out, err = proc.communicate(timeout=200)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def _on_purpose(tmp: Path, purpose: Path) -> subprocess.Popen[str]:
    """Once the node died (after step 3; step 2's checkpoint is whole, and nothing saves until the
    restart), a copy of the checkpoint resumed by a plain 2-rank launch: 3 -> 2 on purpose."""
    deadline = time.monotonic() + 150
    while not (tmp / "failed_at0").is_file():
        assert time.monotonic() < deadline, "the node never failed"
        time.sleep(0.1)
    shutil.copytree(tmp / "ckpt", purpose / "ckpt")
    assert (purpose / "ckpt" / "latest").read_text().strip() == "global_step2"
    (purpose / "log").mkdir()
    argv = zerorun_argv("--num_gpus", "2", "--master_port", "auto", "--env", "ZERORUN_ELASTIC=1", "--env",
                        "ZERORUN_RESTART_COUNT=1", str(SCRIPTS / "train_elastic.py"), "--ckpt", str(purpose / "ckpt"),
                        "--log", str(purpose / "log"))
    return subprocess.Popen(argv, cwd=purpose, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.timeout(400)
def test_a_killed_node_costs_one_restart_and_rejoins_at_the_next(sshd: SshServer, tmp_path: Path) -> None:  # noqa: F811
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("".join(f"{addr} slots=1\n" for addr in (*NODES, THIRD)))
    log = tmp_path / "log"
    log.mkdir()
    argv = zerorun_argv("--hostfile", str(hostfile), "--launcher", "ssh", "--ssh_port", str(sshd.port),
                        "--ssh_args", sshd.ssh_args, "--master_port", "auto", "--nnodes", "2:3", "--rejoin",
                        "--max_restarts", "2", "--restart_backoff", "0", "--kill_timeout", "1",
                        str(SCRIPTS / "train_elastic.py"), "--ckpt", str(tmp_path / "ckpt"), "--log", str(log),
                        "--kill", "0:2:3", "--kill", "1:1:5")
    elastic = subprocess.Popen(argv, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    purpose = tmp_path / "purpose"
    ref = _on_purpose(tmp_path, purpose)  # started beside the restart: one wall time, not two
    run = _finish(elastic)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-5000:]
    assert re.search(r"zerorun: membership: 3 -> 2 node\(s\), world 3 -> 2: 127\.0\.0\.4 out \(its rank failed\); "
                     r"now 127\.0\.0\.2, 127\.0\.0\.3\n", run.stderr), run.stderr[-3000:]
    assert re.search(r"zerorun: membership: 2 -> 2 node\(s\), world 2 -> 2: 127\.0\.0\.3 out \(its rank failed\), "
                     r"127\.0\.0\.4 in; now 127\.0\.0\.2, 127\.0\.0\.4\n", run.stderr), run.stderr[-3000:]
    rows = re.findall(r"^\s+(\d)\s+(\d)\s+(\d)\s+(\S+)\s+(.*)$", run.stderr.split("elastic membership", 1)[1], re.M)
    assert [r[:4] for r in rows] == [("0", "3", "3", "127.0.0.2,127.0.0.3,127.0.0.4"),
                                     ("1", "2", "2", "127.0.0.2,127.0.0.3"),
                                     ("2", "2", "2", "127.0.0.2,127.0.0.4")], run.stderr[-2000:]
    assert rows[2][4] == "exit code 0" and "rank 2 on 127.0.0.4 failed" in rows[0][4]
    assert [int(m) for m in re.findall(r"resumed at global step (\d+)", run.stdout)] == [2, 4]

    records = _records(log)
    committed = {0: 2, 1: 4, 2: 8}  # each attempt's steps up to the checkpoint the next one resumed from
    kept = [r for r in records if r["step"] <= committed[r["attempt"]]]
    for epoch in (0, 1):
        ids = Counter(i for r in kept if r["epoch"] == epoch for i in r["ids"])
        assert sorted(ids) == list(range(48)) and set(ids.values()) == {1}, (epoch, ids)
    per_step: Counter[int] = Counter()
    for r in kept:
        per_step[r["step"]] += len(r["ids"])
    assert per_step == dict.fromkeys(range(1, 9), 12)  # the global batch, at world 3 and at world 2
    assert {r["world"] for r in records if r["attempt"] > 0} == {2}
    failed_at = float((tmp_path / "failed_at0").read_text())
    first = re.search(r"step 3 t=([\d.]+) world 2", run.stdout)
    stopped = re.search(r"every rank stopped ([\d.]+) s later", run.stderr)
    checked = re.search(r"zerorun: checked 3 host\(s\) in ([\d.]+) s: every one answers", run.stderr)
    assert first and stopped and checked, run.stdout[-2000:] + run.stderr[-2000:]
    print(f"elastic 3 -> 2: the first step after the restart ended {float(first.group(1)) - failed_at:.2f} s after "
          f"the failure (every rank stopped {stopped.group(1)} s after it, the hosts checked in {checked.group(1)} s)")

    ref = _finish(ref)
    assert ref.returncode == 0, ref.stderr[-3000:]
    assert "resumed at global step 2" in ref.stdout
    ours = [(r["step"], r["ids"], r["loss"]) for r in kept if r["attempt"] > 0 and r["loss"] is not None]
    theirs = [(r["step"], r["ids"], r["loss"]) for r in _records(purpose / "log") if r["loss"] is not None]
    assert ours == theirs and len(ours) == 6 * 3  # steps 3-8, 3 micro batches each on rank 0


def _pool(n: int) -> tuple[NodeSlots, ...]:
    return tuple(NodeSlots(Host(f"h{i}", 1), (0,)) for i in range(n))


def test_membership_drops_the_failed_node_and_rejoins_it_at_the_next_restart() -> None:
    any_world = lambda world: None  # noqa: E731
    m = Membership(_pool(3), NodeRange(2, 3), rejoin=True)
    first = m.first(any_world)
    assert [n.host.name for n in first] == ["h0", "h1", "h2"]
    change = m.after_failure(first, "h2", 137, {}, any_world)
    assert change is not None and [n.host.name for n in change.members] == ["h0", "h1"]
    assert change_line(first, change) == ("zerorun: membership: 3 -> 2 node(s), world 3 -> 2: h2 out (its rank "
                                          "failed); now h0, h1")
    again = m.after_failure(change.members, "h1", 1, {}, any_world)  # h2 answers again: it is back
    assert again is not None and [n.host.name for n in again.members] == ["h0", "h2"] and again.back == ("h2",)
    assert change_line(change.members, again) == ("zerorun: membership: 2 -> 2 node(s), world 2 -> 2: h1 out (its "
                                                  "rank failed), h2 in; now h0, h2")


def test_membership_without_rejoin_twice_the_same_failure_and_the_last_valid_world() -> None:
    m = Membership(_pool(4), NodeRange(2, 3))
    first = m.first(lambda world: None)
    assert [n.host.name for n in first] == ["h0", "h1", "h2"]  # h3 is a spare
    change = m.after_failure(first, "h1", 137, {"h2": "[ssh] unreachable"}, lambda world: None)
    assert change is not None and [n.host.name for n in change.members] == ["h0", "h3"]
    even = lambda world: None if world % 2 == 0 else "odd"  # noqa: E731
    m = Membership(_pool(3), NodeRange(1, 3))
    assert len(m.first(even)) == 2
    m = Membership(_pool(2), NodeRange(2, 2))  # no world without the suspect: the same gang runs again
    change = m.after_failure(m.first(lambda world: None), "h1", 7, {}, lambda world: None)
    assert change is not None and len(change.members) == 2
    change = m.after_failure(change.members, "h1", 7, {}, lambda world: None)  # twice the same way: out for good
    assert change is None and "h1" in m.gone


def test_too_few_usable_hosts_name_the_ones_out() -> None:
    from launcher.errors import LaunchError

    m = Membership(_pool(3), NodeRange(3, 3))
    m.sitting_out["h0"] = "[ssh] unreachable"
    with pytest.raises(LaunchError, match=r"only 2 usable host\(s\) of 3; h0 out \(\[ssh\] unreachable\)"):
        m.first(lambda world: None)


def test_nnodes_spellings_and_bad_ranges() -> None:
    from launcher.errors import LaunchError

    assert parse_nnodes("2:3", None, None) == NodeRange(2, 3)
    assert parse_nnodes("4", None, None) == NodeRange(4, 4)
    assert parse_nnodes(None, 2, 5) == NodeRange(2, 5)
    assert parse_nnodes(None, None, None) is None
    for bad in (("3:2", None, None), ("a:b", None, None), ("2:3", 2, None), (None, 2, None)):
        with pytest.raises(LaunchError, match="--nnodes"):
            parse_nnodes(*bad)


def test_the_valid_worlds_are_the_configs_that_keep_their_global_batch(tmp_path: Path) -> None:
    from launcher.elastic.supervisor import world_check

    fixed = tmp_path / "fixed.json"
    fixed.write_text(json.dumps({"train_batch_size": 24, "train_micro_batch_size_per_gpu": 4}))
    block = tmp_path / "elastic.json"
    block.write_text(json.dumps({"elasticity": {"enabled": True, "max_train_batch_size": 24,
                                                "micro_batch_sizes": [2, 4], "version": 0.1, "max_gpus": 4}}))
    check = world_check([str(fixed)])
    assert [w for w in range(1, 8) if check(w) is None] == [1, 2, 3, 6]
    assert "restart at 3 or 6 ranks" in (check(4) or "")
    assert [w for w in range(1, 8) if world_check([str(block)])(w) is None] == [1, 2, 3, 4]
    assert world_check([])(5) is None  # no config the launcher can see: the ranks decide
    m = Membership(_pool(5), NodeRange(2, 5))
    assert len(m.first(check)) == 3  # 5 and 4 nodes cannot keep 24 with micro batch 4


@pytest.mark.timeout(120)
def test_a_host_that_fails_the_preflight_sits_out_while_min_nodes_remain(sshd: SshServer, tmp_path: Path) -> None:  # noqa: F811
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("127.0.0.5 slots=1\n" + "".join(f"{addr} slots=1\n" for addr in NODES))  # .5: no sshd
    base = ["--hostfile", str(hostfile), "--launcher", "ssh", "--ssh_port", str(sshd.port), "--ssh_args",
            sshd.ssh_args, "--master_port", "auto", "--no_local_rank", "--no_python"]
    run = subprocess.run(zerorun_argv(*base, "--nnodes", "2:3", "/bin/echo", "rank up"), cwd=tmp_path,
                         capture_output=True, text=True, timeout=100)
    assert run.returncode == 0, run.stderr[-3000:]
    assert re.search(r"zerorun: membership: before the start: 127\.0\.0\.5 out \(\[\w+\] ", run.stderr), run.stderr
    assert sorted(re.findall(r"\[(127\.0\.0\.\d):\d\] rank up", run.stdout)) == list(NODES)
