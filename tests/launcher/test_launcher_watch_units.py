"""The watch's pure parts on synthetic beats: the live table (rich's capture), the plain line, the
summary, stragglers, the stall verdict's grouping, the stall timeout, the agent's beat check, and
the watch's answer to a stall (stop, or --on_stall report) over a stand-in executor."""

from __future__ import annotations

import io
import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from rich.console import Console

from launcher.plan.runners import PayloadMode
from launcher.protocol import Command, Event
from launcher.watch.heartbeat_relay import checked_beat
from launcher.watch.heartbeats import Board
from launcher.watch.liveview import plain_line, table
from launcher.watch.stall import STALL_EXIT, RankPlace, StallPolicy, parse_stacks, rank_list, verdict
from launcher.watch.stragglers import StragglerTracker
from launcher.watch.summary import summary
from launcher.watch.watcher import RunWatch, WatchOptions


def _board() -> Board:
    b = Board(4, started_at=100.0)
    b.started(0, "node-a", {"0": 10, "1": 11}, 100.0)
    b.started(1, "node-b", {"2": 12, "3": 13}, 100.0)
    for r in range(4):
        busy = 0.9 if r == 3 else 0.1
        b.on_beat(r, {"step": 7, "micro": 7, "phase": "forward", "issued": [40, "all_gather", 8192, "bf16"],
                      "completed": [39, "reduce_scatter", 4096, "fp32"], "samples_per_step": 32,
                      "mem": {"rss": (r + 1) * 2**30, "peak_rss": (r + 2) * 2**30},
                      "steps": [[s, 1.0, 1.0 - busy] for s in range(1, 8)]}, 105.0)
    return b


def test_the_live_table_shows_every_rank_its_step_rate_memory_and_flags() -> None:
    console = Console(record=True, width=140)
    console.print(table(_board(), {3}, now=112.0))
    text = console.export_text()
    assert "12 s | step 7 | 1.000 s/step | 4/4 ranks alive | 32.0 samples/s | slowest rank 3 (0.900 s busy)" in text
    row3 = next(line for line in text.splitlines() if line.startswith("node-b") and " 3 " in line)
    assert "alive" in row3 and "1.000" in row3 and "0.900" in row3 and "all_gather #40" in row3
    assert "4.0 GiB" in row3 and "straggler" in row3
    assert "plain" not in text and "| stragglers: 3" in plain_line(_board(), {3}, 112.0)


def test_the_summary_lists_each_rank_and_the_stragglers() -> None:
    b = _board()
    for r in range(4):
        b.on_exit(r, 0, 120.0)
    t = StragglerTracker(4, steps=3)
    for r, s in b.ranks.items():
        t.add(r, s.host, list(s.steps))
    assert sorted(t.flagged) == [3]
    text = summary(b, 130.0, 0, list(t.flagged.values()), "/logs")
    assert "4 rank(s) on 2 node(s), wall 30.0 s, 7 step(s), exit code 0" in text
    assert "rank 3 (node-b) is a straggler: 0.900 s of its own work per step, 9.0x" in text
    assert "logs: /logs (rank<R>.log)" in text and "5.0 GiB" in text


def test_the_summary_says_training_completed_when_a_rank_fails_at_teardown() -> None:
    b = _board()
    b.on_beat(1, {"step": 7, "phase": "exiting"}, 118.0)  # the script ended; its interpreter exit aborted
    b.on_beat(2, {"step": 7, "phase": "forward"}, 118.0)  # killed mid-step: no such line
    for r, code in enumerate([0, 134, 143, 0]):
        b.on_exit(r, code, 120.0)
    text = summary(b, 130.0, 134, [], None)
    assert ("training completed (last step 7 reported) but rank 1 exited with 134 (SIGABRT) at teardown, "
            "after its script ended: the run counts as failed") in text
    assert "rank 2 exited" not in text and "exit code 134" in text


def test_a_rank_ended_by_its_own_error_is_no_teardown_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    """An uncaught exception also runs the exit path: the rank says so, and the summary does not call
    the training completed (a crash in step 0 once read "training completed (last step 0 reported)")."""
    from zerorun.heartbeat import channel
    from zerorun.heartbeat.state import PROGRESS, Phase

    monkeypatch.setattr(PROGRESS, "phase", PROGRESS.phase)  # restored after: the state is the process's
    monkeypatch.setattr(sys, "last_value", RuntimeError("boom"), raising=False)
    channel.say_exiting()
    assert PROGRESS.phase == Phase.EXITING_AFTER_ERROR
    monkeypatch.delattr(sys, "last_value")
    channel.say_exiting()
    assert PROGRESS.phase == Phase.EXITING
    b = _board()
    b.on_beat(1, {"step": 0, "phase": Phase.EXITING_AFTER_ERROR}, 118.0)
    for r, code in enumerate([143, 1, 0, 0]):
        b.on_exit(r, code, 120.0)
    assert "training completed" not in summary(b, 130.0, 1, [], None)


def test_the_verdict_names_the_rank_that_is_elsewhere() -> None:
    stack = ['Current thread 0x1 (most recent call first):', '  File "/w/model.py", line 88 in forward',
             '  File "/w/train.py", line 12 in <module>']
    frames = parse_stacks(stack)[0]
    waiting = [RankPlace(r, "a", "forward", [1842, "all_gather", 8_400_000, "bf16"]) for r in (0, 1, 2, 4, 5, 6, 7)]
    v = verdict([*waiting, RankPlace(3, "b", "forward", None, frames)], 30.0, 20.0, {0: "layers.11"})
    assert v.text == ("stalled: rank 3 (b) is in forward at model.py:88; ranks 0-2,4-7 wait in all_gather #1842 "
                      "(8.4M bf16, unit layers.11)")
    assert v.culprits == [3] and json.loads(json.dumps(v.to_json()))["groups"][1]["collective"]["seq"] == 1842
    assert rank_list([0, 1, 3, 4, 5]) == "0,1,3-5"


def test_the_stall_timeout_waits_out_set_up_and_follows_the_step_time() -> None:
    b = Board(2, 0.0)
    b.started(0, "h", {"0": 5, "1": 6}, 0.0)
    assert StallPolicy(3.0, 600.0).limit(b) == 600.0  # no rank has finished a step: set-up allowance
    for r in range(2):
        b.on_beat(r, {"step": 2, "phase": "script", "steps": [[1, 10.0, 0.0], [2, 10.0, 0.0]]}, 1.0)
    assert StallPolicy(3.0, 600.0).limit(b) == 600.0  # no rank waits on a peer: the script's own work (an eval)
    b.on_beat(1, {"step": 2, "phase": "forward", "issued": [9, "all_gather", 64, "fp32"], "completed": [8]}, 1.0)
    assert StallPolicy(3.0, 600.0).limit(b) == 3.0  # rank 1 waits in an all-gather
    assert StallPolicy(None).limit(b) == 200.0  # auto: 20 x a 10 s step
    before = b.last_progress_at
    b.on_beat(0, {"step": 2, "phase": "script", "steps": []}, 9.0)
    assert b.last_progress_at == before  # alive, nothing new: no progress
    b.on_beat(0, {"step": 2, "phase": "checkpoint-save", "io": 5}, 10.0)
    b.on_beat(0, {"step": 2, "phase": "checkpoint-save", "io": 9}, 11.0)
    assert b.last_progress_at == 11.0  # a checkpoint's I/O is progress


def test_the_agent_keeps_only_well_formed_fields_of_a_beat() -> None:
    beat = checked_beat(json.dumps({"v": 1, "step": 3, "phase": "x" * 500, "rank": 7, "mem": {"rss": -1}}).encode())
    assert beat == {"v": 1, "step": 3}  # no rank field is ever taken from a beat; bad values dropped
    assert checked_beat(b"[rank 0] step 3") is None and checked_beat(b'{"v": 2}') is None


class _Run:
    command = SimpleNamespace(payload=PayloadMode.STDIN)

    def __init__(self) -> None:
        self.sent: list[Command] = []

    def send(self, cmd: Command, close: bool = False) -> None:
        self.sent.append(cmd)


class _Executor:
    def __init__(self) -> None:
        self.runs, self.stopping_since, self.stops = [_Run()], None, 0

    def stop_all(self) -> None:
        self.stops, self.stopping_since = self.stops + 1, 1.0


def _stall_once(w: RunWatch, ex: _Executor, step: int) -> None:
    """Rank 0 waits in a reduce-scatter, rank 1 is elsewhere; then the stall timeout passes and both send stacks."""
    run = ex.runs[0]
    w.on_event(run, Event("heartbeat", {"node_rank": 0, "rank": 0, "beat": {
        "step": step, "phase": "backward", "issued": [step * 10, "reduce_scatter", 64, "fp32"],
        "completed": [step * 10 - 1, "all_reduce", 1, "fp32"], "steps": [[step, 0.01, 0.0]]}}))
    w.on_event(run, Event("heartbeat", {"node_rank": 0, "rank": 1, "beat": {
        "step": step, "phase": "script", "steps": [[step, 0.01, 0.0]]}}))
    time.sleep(0.12)
    w.tick(ex)  # past the timeout: every agent is asked for its ranks' stacks
    for rank in (0, 1):
        line = f'  File "/w/train.py", line {64 + rank} in <module>'
        w.on_event(run, Event("stacks", {"node_rank": 0, "rank": rank, "lines": ["Current thread 0x1:", line]}))
    w.tick(ex)  # every rank answered: the verdict


def test_on_stall_report_keeps_waiting_and_reports_again_after_progress(tmp_path: Path) -> None:
    opts = WatchOptions(quiet=True, stall=StallPolicy(0.05, 0.05), on_stall="report",
                        report_json=str(tmp_path / "v.json"), log_dir=str(tmp_path / "logs"))
    err, ex = io.StringIO(), _Executor()
    w = RunWatch(opts, 2, "job", err=err)
    w.on_event(ex.runs[0], Event("started", {"node_rank": 0, "host": "h", "pids": {"0": 5, "1": 6}}))
    _stall_once(w, ex, 1)
    assert ex.runs[0].sent == [Command.STACKS] and len(w.verdicts) == 1
    assert json.loads((tmp_path / "v.json").read_text())["culprits"] == [1]
    time.sleep(0.12)
    w.tick(ex)
    assert ex.runs[0].sent == [Command.STACKS]  # the same stall is reported once
    _stall_once(w, ex, 2)  # progress (step 2), then a stall anew: reported again
    assert len(w.verdicts) == 2 and (tmp_path / "logs" / "stall-stacks-2.txt").exists()
    assert (ex.stops, w.exit_code) == (0, None) and "stopping" not in err.getvalue()
    assert "stalled: rank 1 (h) is in script at train.py:65; rank 0 (h) waits in reduce_scatter #20" in err.getvalue()
    stop = RunWatch(WatchOptions(quiet=True, stall=StallPolicy(0.05, 0.05), log_dir=str(tmp_path / "logs")), 2, "j",
                    err=io.StringIO())
    stop.on_event(ex.runs[0], Event("started", {"node_rank": 0, "host": "h", "pids": {"0": 5, "1": 6}}))
    _stall_once(stop, ex, 1)
    assert (ex.stops, stop.exit_code) == (1, STALL_EXIT)  # the default: stop every rank, exit status 124


def test_off_a_terminal_a_progress_line_each_interval_and_none_with_quiet() -> None:
    ex, lines = _Executor(), {}
    for quiet in (False, True):
        err = io.StringIO()  # not a terminal
        w = RunWatch(WatchOptions(quiet=quiet, progress_every_s=0.01), 2, "job", err=err)
        w.on_event(ex.runs[0], Event("started", {"node_rank": 0, "host": "h", "pids": {"0": 5, "1": 6}}))
        for _ in range(3):
            time.sleep(0.02)
            w.tick(ex)
        lines[quiet] = err.getvalue().splitlines()
    assert len(lines[False]) == 3 and all("| no step yet | 2/2 ranks alive" in x for x in lines[False]), lines
    assert lines[True] == []
