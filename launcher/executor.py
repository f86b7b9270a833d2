"""Starts the per-node commands, relays their output, and tears the gang down.

The first failure any agent reports (or a node command dying without a report, e.g.
ssh failing to connect) stops every other node at once: agents fed on stdin get
``stop`` and EOF; pdsh, srun and mpirun get SIGTERM on their process group, which
closes their ssh connections, so the remote agents see EOF and stop their ranks.
The first Ctrl-C forwards SIGINT to every rank; a second one kills.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TextIO

from launcher.lifecycle import exit_status
from launcher.lifeline import die_with_parent
from launcher.plan import LaunchPlan
from launcher.protocol import Command, decode_event
from launcher.report import Failure
from launcher.runners import NodeCommand, PayloadMode

GRACE_S = 5.0
"""Extra seconds, past the agents' kill timeout, before the launcher kills its own children."""
KILL_GRACE_S = 3.0
"""After a second Ctrl-C: seconds the agents get to SIGKILL their ranks before they are killed too."""


@dataclass
class NodeRun:
    """One started command and what the launcher saw of it."""

    command: NodeCommand
    proc: subprocess.Popen[bytes]
    stderr_tail: deque[str] = field(default_factory=lambda: deque(maxlen=20))
    readers: list[threading.Thread] = field(default_factory=list)
    reported: bool = False
    stdin_open: bool = True
    rank_pids: tuple[int, ...] = ()

    def send(self, cmd: Command, close: bool = False) -> None:
        if self.proc.stdin is None or not self.stdin_open:
            return
        try:
            self.proc.stdin.write((cmd.value + "\n").encode())
            self.proc.stdin.flush()
            if close:
                self.proc.stdin.close()
                self.stdin_open = False
        except (BrokenPipeError, OSError, ValueError):
            self.stdin_open = False

    def signal_group(self, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signum)

    def kill(self) -> None:
        """SIGKILL the command's group and, for a local agent, its ranks' groups."""
        self.signal_group(signal.SIGKILL)
        if not self.command.remote:
            for pid in self.rank_pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, signal.SIGKILL)


@dataclass
class RunResult:
    exit_code: int
    failures: list[Failure]
    interrupted: bool = False
    started_at: dict[int, float] = field(default_factory=dict)


def write_payload(path: str, data: str) -> None:
    """Write ``data`` to ``path`` readable by the owner only (created 0600, never wider)."""
    Path(path).parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(data)


class Executor:
    """Runs the commands of one launch to completion."""

    def __init__(self, plan: LaunchPlan, commands: list[NodeCommand], out: TextIO | None = None, err: TextIO | None = None) -> None:
        self.plan = plan
        self.commands = commands
        self.out = out or sys.stdout
        self.err = err or sys.stderr
        self.runs: list[NodeRun] = []
        self.events: queue.Queue[tuple[NodeRun, dict]] = queue.Queue()
        self.failures: list[Failure] = []
        self.started_at: dict[int, float] = {}
        self.interrupts = 0
        self.stopping_since: float | None = None
        self.kill_at: float | None = None
        self.signal_status = 130
        self._lock = threading.Lock()

    def _start(self, cmd: NodeCommand, payload: str) -> NodeRun:
        if cmd.payload is PayloadMode.FILE:
            assert cmd.payload_path is not None
            write_payload(cmd.payload_path, payload)
        stdin = subprocess.DEVNULL if cmd.payload is PayloadMode.NONE else subprocess.PIPE
        # srun/mpirun hold no pipe to us that they would notice closing: if the launcher is
        # killed they get SIGTERM instead and tear their job down
        lifeline = die_with_parent(signal.SIGTERM) if cmd.payload is PayloadMode.NONE else None
        proc = subprocess.Popen(
            list(cmd.argv), stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env={**os.environ, **dict(cmd.env)}, start_new_session=True, preexec_fn=lifeline,
        )
        run = NodeRun(cmd, proc)
        if cmd.payload is PayloadMode.STDIN:
            assert proc.stdin is not None
            proc.stdin.write((payload + "\n").encode())
            proc.stdin.flush()
        for stream, is_err in ((proc.stdout, False), (proc.stderr, True)):
            t = threading.Thread(target=self._pump, args=(run, stream, is_err), daemon=True)
            t.start()
            run.readers.append(t)
        return run

    def _pump(self, run: NodeRun, stream: IO[bytes] | None, is_err: bool) -> None:
        assert stream is not None
        sink = self.err if is_err else self.out
        for data in iter(stream.readline, b""):
            text = data.decode(errors="replace")
            event = None if is_err else decode_event(text)
            if event is not None:
                self.events.put((run, event))
                continue
            if is_err:
                run.stderr_tail.append(text.rstrip("\n"))
            with self._lock:
                sink.write(text if text.endswith("\n") else text + "\n")
                sink.flush()

    def _note(self, text: str) -> None:
        with self._lock:
            self.err.write(f"zerorun: {text}\n")
            self.err.flush()

    def _on_event(self, run: NodeRun, event: dict) -> None:
        kind = event.get("event")
        if kind == "started":
            self.started_at[int(event.get("node_rank", -1))] = time.time()
            run.rank_pids = tuple(int(p) for p in (event.get("pids") or {}).values())
        elif kind == "failed":
            run.reported = True
            failure = Failure.from_event(event)
            self.failures.append(failure)
            if len(self.failures) == 1:
                self._note(f"rank {failure.rank} on {failure.host} failed ({failure.describe_code()}); stopping every node")
                self.stop_all()

    def _on_exit(self, run: NodeRun) -> None:
        for t in run.readers:
            t.join(timeout=2.0)  # drain: a 'failed' event may still be in the pipe
        self._drain_events()
        rc = run.proc.returncode
        if rc != 0 and not run.reported and self.stopping_since is None and not self.interrupts:
            code = exit_status(rc)
            host = run.command.host
            self.failures.append(Failure(host, run.command.node_rank, code, time.time(), stderr_tail=tuple(run.stderr_tail)))
            self._note(f"the command for {host} exited with status {code} before its ranks reported; stopping every node")
            self.stop_all()

    def _drain_events(self) -> None:
        while True:
            try:
                run, event = self.events.get_nowait()
            except queue.Empty:
                return
            self._on_event(run, event)

    def stop_all(self, cmd: Command = Command.STOP) -> None:
        """Tell every node to stop (or, with INT, forward SIGINT; with KILL, kill now)."""
        now = time.monotonic()
        if cmd is not Command.INT and self.stopping_since is None:
            self.stopping_since = now
            self.kill_at = now + self.plan.options.kill_timeout + GRACE_S
        if cmd is Command.KILL:
            self.kill_at = min(self.kill_at or now + KILL_GRACE_S, now + KILL_GRACE_S)
        for run in self.runs:
            if run.proc.poll() is not None:
                continue
            if run.command.payload is PayloadMode.STDIN:
                run.send(cmd, close=cmd is not Command.INT)  # the agent kills its ranks, then exits
            else:  # pdsh/srun treat one SIGINT as "print status": no way to forward it, so stop
                run.signal_group(signal.SIGKILL if cmd is Command.KILL else signal.SIGTERM)

    def _on_signal(self, signum: int, _frame: object) -> None:
        self.interrupts += 1
        if self.interrupts == 1:
            self.signal_status = 128 + signum
        if signum != signal.SIGINT:
            self._note(f"received {signal.Signals(signum).name}; stopping every node")
            self.stop_all(Command.STOP)
        elif self.interrupts == 1:
            self._note("Ctrl-C: forwarding SIGINT to every rank (press Ctrl-C again to kill)")
            self.stop_all(Command.INT)
        else:
            self._note("second Ctrl-C: killing every rank")
            self.stop_all(Command.KILL)

    def run(self) -> RunResult:
        """Start every command, relay output, wait; the exit code is the first failure's."""
        payload = json.dumps(self.plan.to_dict())
        handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
        in_main = threading.current_thread() is threading.main_thread()
        if in_main:
            for s in handlers:
                signal.signal(s, self._on_signal)
        try:
            for cmd in self.commands:
                self.runs.append(self._start(cmd, payload))
            self._watch()
        finally:
            if in_main:
                for s, h in handlers.items():
                    signal.signal(s, h)
            self._cleanup()
        return RunResult(self._exit_code(), self.failures, self.interrupts > 0, self.started_at)

    def _watch(self) -> None:
        pending = list(self.runs)
        while pending:
            try:
                run, event = self.events.get(timeout=0.05)
                self._on_event(run, event)
            except queue.Empty:
                pass
            for run in [r for r in pending if r.proc.poll() is not None]:
                pending.remove(run)
                self._on_exit(run)
            if self.kill_at is not None and time.monotonic() > self.kill_at:
                for run in pending:
                    run.kill()
        self._drain_events()

    def _exit_code(self) -> int:
        if self.failures:
            return self.failures[0].exit_code
        if self.interrupts:
            return self.signal_status  # 130 for Ctrl-C, 143 for SIGTERM
        return 0

    def _cleanup(self) -> None:
        for run in self.runs:
            if run.proc.poll() is None:
                run.kill()
                run.proc.wait()
            path = run.command.payload_path
            if path:
                Path(path).unlink(missing_ok=True)
                with contextlib.suppress(OSError):  # the job's folder, then .zerorun if empty
                    Path(path).parent.rmdir()
                    Path(path).parent.parent.rmdir()
