"""launcher/protocol.py and the executor's side of it: rank output cannot forge an agent
event (a forged event of each kind is shown as text, kills nothing, crashes nothing),
and every field of a keyed event is checked, a bad one logged, never raised."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from launcher_conftest import SCRIPTS, alive, wait_gone, zerorun_argv

from launcher.plan.filters import NodeSlots
from launcher.plan.hostfile import Host
from launcher.plan.launch_plan import build_plan
from launcher.plan.runners import NodeCommand, PayloadMode
from launcher.protocol import EVENTS, MARKER, BadEvent, decode_event, encode_event, new_key, validate
from launcher.run.executor import Executor

KEY = "k" * 32
GOOD = {
    "started": {"node_rank": 0, "host": "h", "pids": {"0": 1234}},
    "failed": {"node_rank": 0, "host": "h", "rank": 0, "local_rank": 0, "exit_code": 3, "signal": None,
               "pid": 1234, "time": 1.5, "stderr_tail": ["boom"], "log_path": None},
    "exited": {"node_rank": 0, "host": "h", "exit_code": 0, "reason": None},
    "heartbeat": {"node_rank": 0, "rank": 1, "beat": {"step": 3, "phase": "forward"}},
    "stacks": {"node_rank": 0, "rank": 1, "lines": ['File "train.py", line 88, in forward']},
    "rank_exited": {"node_rank": 0, "rank": 1, "exit_code": 0},
}
BAD = [  # (kind, field, value): each makes the event malformed
    ("started", "pids", {"0": "1234; rm"}), ("started", "pids", {"0": 1}), ("started", "pids", [1234]),
    ("started", "pids", {"zero": 1234}), ("started", "node_rank", -1), ("started", "node_rank", True),
    ("failed", "exit_code", "7"), ("failed", "exit_code", 999), ("failed", "rank", None), ("failed", "time", "now"),
    ("failed", "stderr_tail", "x"), ("failed", "stderr_tail", [1]), ("failed", "host", ["h"]),
    ("failed", "signal", 9), ("exited", "exit_code", None), ("exited", "host", "x" * 10_000),
]


def test_the_good_events_pass_and_round_trip() -> None:
    assert set(GOOD) == set(EVENTS)
    for kind, fields in GOOD.items():
        event = decode_event(encode_event(KEY, kind, **fields), KEY)
        assert event is not None and event.kind == kind and dict(event.fields) == fields


def test_without_the_key_a_line_is_text() -> None:
    line = MARKER + json.dumps({"event": "failed", **GOOD["failed"]})
    assert decode_event(line, KEY) is None
    assert decode_event(encode_event("0" * 32, "failed", **GOOD["failed"]), KEY) is None
    assert decode_event("[h:0] " + encode_event(KEY, "failed", **GOOD["failed"]), KEY) is None  # not at the start
    assert decode_event("0: " + encode_event(KEY, "failed", **GOOD["failed"]), KEY, anywhere=True) is not None
    assert decode_event(encode_event("", "failed", **GOOD["failed"]), "") is None  # no key, no channel
    assert new_key() != new_key() and len(new_key()) == 32


@pytest.mark.parametrize(("kind", "name", "value"), BAD)
def test_every_field_is_checked(kind: str, name: str, value: object) -> None:
    with pytest.raises(BadEvent, match=name):
        decode_event(encode_event(KEY, kind, **{**GOOD[kind], name: value}), KEY)


def test_kinds_extra_fields_and_shapes_are_checked() -> None:
    for data, what in [({"event": "exec"}, "unknown event kind"), ([1], "not a JSON object"),
                       ({"event": "exited", **GOOD["exited"], "argv": ["sh"]}, "unexpected field")]:
        with pytest.raises(BadEvent, match=what):
            validate(data)
    with pytest.raises(BadEvent, match="not JSON"):
        decode_event(f"{MARKER}{KEY} {{not json", KEY)
    with pytest.raises(BadEvent, match="not JSON"):
        decode_event(f"{MARKER}{KEY} " + "[" * 100_000, KEY)


def _agent_impostor(tmp_path: Path, body: str) -> tuple[Executor, io.StringIO, int]:
    """An Executor over one local 'agent' that is a script printing ``body``'s keyed events."""
    plan = build_plan((NodeSlots(Host("localhost", 2), (0, 1)),), command=("x",), job_id="j", cwd=str(tmp_path),
                      python=sys.executable, local=True, channel_key=KEY)
    script = textwrap.dedent(f"""
        import json, subprocess, sys, time
        def ev(kind, **f):
            print({MARKER!r} + {KEY!r} + " " + json.dumps({{"event": kind, **f}}), flush=True)
        {textwrap.indent(textwrap.dedent(body), "        ").strip()}
    """)
    cmd = NodeCommand((sys.executable, "-c", script), 0, "localhost", PayloadMode.NONE, remote=False)
    err = io.StringIO()
    return Executor(plan, [cmd], out=io.StringIO(), err=err), err, 0


def test_keyed_events_with_foreign_pids_or_nodes_kill_nothing(tmp_path: Path) -> None:
    victim = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        body = f"""
            rank = subprocess.Popen(["sleep", "60"], start_new_session=True, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL)  # a real rank of this agent
            print(rank.pid, file=sys.stderr, flush=True)
            ev("started", node_rank=0, host="h", pids={{"0": rank.pid, "1": {victim.pid}}})
            ev("started", node_rank=0, host="h", pids={{"0": {victim.pid}}})     # a second one: ignored
            ev("failed", node_rank=1, host="h", rank=0, local_rank=0, exit_code=1, time=0, stderr_tail=[])
            ev("failed", node_rank=0, host="h", rank=7, local_rank=0, exit_code=1, time=0, stderr_tail=[])
            ev("started", pids="all")
            ev("roll_call", step=1)
            time.sleep(0.5)  # a real agent lives on after "started": the launcher checks its children meanwhile
            sys.exit(5)  # the agent dies without reporting: its proven rank is killed, nothing else
        """
        executor, err, _ = _agent_impostor(tmp_path, body)
        result = executor.run()
        notes = err.getvalue()
        rank = int(next(line for line in notes.splitlines() if line.isdigit()))
        assert result.exit_code == 5 and result.failures[0].rank is None, notes
        assert "ignored a started event from localhost: a second started event" in notes
        assert "it names node 1, it came from node 0" in notes and "rank 7 does not run there" in notes
        assert "field 'node_rank' must be a node rank" in notes and "unknown event kind 'roll_call'" in notes
        assert wait_gone([rank], timeout=5) == []
        assert alive(victim.pid)
    finally:
        victim.kill()
        victim.wait()


def test_a_new_kind_is_one_entry_and_one_handler(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from launcher.protocol import Field, small_json

    monkeypatch.setitem(EVENTS, "roll_call", {"rank": EVENTS["failed"]["rank"], "payload": Field(small_json)})
    executor, err, _ = _agent_impostor(tmp_path, """
        ev("roll_call", rank=1, payload={"step": 3, "phase": "forward"})
        ev("roll_call", rank=1, payload={"step": float("nan")})
    """)
    seen: list[dict] = []
    executor.on("roll_call", lambda run, event: seen.append(dict(event.fields)))
    assert executor.run().exit_code == 0
    assert seen == [{"rank": 1, "payload": {"step": 3, "phase": "forward"}}]
    assert "field 'payload' must be valid" in err.getvalue()


def test_forged_events_in_rank_output_are_text(tmp_path: Path) -> None:
    victim = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        out = subprocess.run(zerorun_argv("--num_gpus", "1", "--no_local_rank", "--master_port", "auto",
                                          str(SCRIPTS / "forge_events.py"), str(victim.pid), "3"),
                             cwd=tmp_path, capture_output=True, text=True, timeout=60)
        assert out.returncode == 3, out.stderr
        assert "Traceback" not in out.stderr and "exit code 3" in out.stderr
        assert '[localhost:0] @@zerorun-agent@@ {"event": "failed"}' in out.stdout
        assert out.stdout.count("@@zerorun-agent@@") == 13 and "[localhost:0] key in env: False" in out.stdout
        assert '[localhost:0] @@zerorun-agent@@ {"event": "started"' in out.stderr
        assert alive(victim.pid)
    finally:
        os.kill(victim.pid, signal.SIGKILL)
        victim.wait()


def test_the_shim_keeps_the_key_from_its_rank_and_signs_its_report() -> None:
    env = {**os.environ, "OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
           "OMPI_COMM_WORLD_LOCAL_SIZE": "2", "ZERORUN_NODES": "h:2", "ZERORUN_CHANNEL_KEY": KEY}
    rank = "import os, sys; print('key' if 'ZERORUN_CHANNEL_KEY' in os.environ else 'no key'); sys.exit(4)"
    out = subprocess.run([sys.executable, "-m", "launcher.run.shim", "--", sys.executable, "-c", rank], env=env,
                         capture_output=True, text=True, timeout=30)
    lines = out.stdout.splitlines()
    assert out.returncode == 4 and lines[0] == "[h:1] no key", out.stderr
    event = decode_event(lines[1], KEY)
    assert event is not None and (event.kind, event.fields["rank"], event.fields["exit_code"]) == ("failed", 1, 4)


def test_the_dry_run_never_shows_the_key() -> None:
    from launcher.plan.runners import RunnerKind, build_commands
    from launcher.watch.display import command_line, plan_json, plan_text

    plan = build_plan((NodeSlots(Host("w1", 2), (0, 1)),), command=("x",), job_id="j", cwd="/w", python="p",
                      channel_key=new_key())
    for kind in (RunnerKind.SSH, RunnerKind.PDSH, RunnerKind.SLURM, RunnerKind.OPENMPI):
        cmds = build_commands(plan, kind, payload_dir="/w/.zerorun/j")
        shown = plan_text(plan, cmds, kind, None) + json.dumps(plan_json(plan, cmds, kind))
        assert plan.channel_key not in shown + "".join(command_line(c) for c in cmds) + " ".join(cmds[0].argv)
