"""Starts the per-node commands, relays their output, and tears the gang down.

The first failure any agent reports (or a node command dying without a report, e.g.
ssh failing to connect) stops every other node at once: agents fed on stdin get
``stop`` and EOF; pdsh, srun and mpirun get SIGTERM on their process group, which
closes their ssh connections, so the remote agents see EOF and stop their ranks.
The first Ctrl-C forwards SIGINT to every rank; a second one kills.

Events reach the executor only on the channel of launcher/protocol.py (the attempt's
key, checked fields); anything else on an agent's stdout is a rank's text and is
printed as such. Signal handlers only put the signal on a ``SimpleQueue``: the main
loop acts on it, so a handler never takes a lock the interrupted code may hold, and
no node starts once a signal has arrived. Every command carries a lifeline (it gets
SIGTERM if the launcher dies): pdsh, srun and mpirun tear their job down, an agent
stops its ranks.
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
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, TextIO

from launcher.plan.launch_plan import LaunchPlan
from launcher.plan.runners import NodeCommand, PayloadMode
from launcher.protocol import BadEvent, Command, Event, decode_event
from launcher.run.lifecycle import exit_status
from launcher.run.lifeline import die_with_parent
from launcher.run.planfile import write_plan_file
from launcher.run.procs import ProcInfo, child_groups, kill_group
from launcher.watch.once import OnceFilter
from launcher.watch.report import Failure

if TYPE_CHECKING:
    from launcher.watch.watcher import RunWatch

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
    rank_groups: tuple[ProcInfo, ...] = ()
    """A local agent's ranks, as proven children of that agent (launcher/run/procs.py)."""
    started: bool = False

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
        self.kill_ranks()

    def kill_ranks(self) -> None:
        """SIGKILL the rank groups a local agent started (each only while it is still that process)."""
        for info in self.rank_groups:
            kill_group(info)


@dataclass
class RunResult:
    exit_code: int
    failures: list[Failure]
    interrupted: bool = False
    started_at: dict[int, float] = field(default_factory=dict)


Handler = Callable[[NodeRun, Event], None]


class Executor:
    """Runs the commands of one launch to completion."""

    def __init__(self, plan: LaunchPlan, commands: list[NodeCommand], out: TextIO | None = None, err: TextIO | None = None,
                 watch: RunWatch | None = None) -> None:
        self.plan = plan
        self.commands = commands
        self.watch = watch  # heartbeats, live view, stall verdict (launcher.watch.watcher)
        self.out = out or sys.stdout
        self.err = err or sys.stderr
        self.runs: list[NodeRun] = []
        self.events: queue.Queue[tuple[NodeRun, Event]] = queue.Queue()
        self.signals: queue.SimpleQueue[int] = queue.SimpleQueue()
        """Signals the handler received, for the main loop to act on (the handler does nothing else)."""
        self.failures: list[Failure] = []
        self.started_at: dict[int, float] = {}
        self.interrupts = 0
        self.stopping_since: float | None = None
        self.kill_at: float | None = None
        self.signal_status = 130
        self._lock = threading.Lock()
        self.once = OnceFilter()
        """What of the ranks' stderr reached the console (the failure report repeats none of it)."""
        self.handlers: dict[str, list[Handler]] = {
            "started": [self._on_started], "failed": [self._on_failed], "exited": []}
        if watch is not None:
            watch.attach(self)

    def on(self, kind: str, handler: Handler) -> None:
        """Call ``handler(run, event)`` for every checked event of ``kind`` (a key of protocol.EVENTS)."""
        self.handlers.setdefault(kind, []).append(handler)

    def _start(self, cmd: NodeCommand, payload: str) -> NodeRun:
        if cmd.payload is PayloadMode.FILE:
            assert cmd.payload_path is not None
            write_plan_file(cmd.payload_path, payload)
        stdin = subprocess.DEVNULL if cmd.payload is PayloadMode.NONE else subprocess.PIPE
        # every command gets SIGTERM if the launcher dies (SIGKILL, OOM): srun, mpirun and pdsh
        # tear their job down, an agent stops its ranks (ssh's agents also see EOF)
        proc = subprocess.Popen(
            list(cmd.argv), stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env={**os.environ, **dict(cmd.env)}, start_new_session=True, preexec_fn=die_with_parent(signal.SIGTERM),
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
        anywhere = run.command.payload is PayloadMode.NONE  # srun --label / mpirun --tag-output prefix lines
        for data in iter(stream.readline, b""):
            text = data.decode(errors="replace")
            if not is_err:
                try:
                    event = decode_event(text, self.plan.channel_key, anywhere)
                except BadEvent as e:
                    self._note(f"ignored a malformed event from {run.command.host}: {e}")
                    continue
                if event is not None:
                    self.events.put((run, event))
                    continue
            if is_err:
                run.stderr_tail.append(text.rstrip("\n"))
                if not self.once.show(text):  # the same error from another rank: shown once
                    continue
            with self._lock:
                sink.write(text if text.endswith("\n") else text + "\n")
                sink.flush()

    def _note(self, text: str) -> None:
        with self._lock:
            self.err.write(f"zerorun: {text}\n")
            self.err.flush()

    def _on_event(self, run: NodeRun, event: Event) -> None:
        for handler in self.handlers.get(event.kind, ()):
            try:
                handler(run, event)
            except Exception as e:  # a handler's bug must not take the run's teardown down with it
                self._note(f"ignored {event.kind} event from {run.command.host}: {type(e).__name__}: {e}")

    def _node_mismatch(self, run: NodeRun, event: Event) -> str | None:
        """Why ``event`` cannot come from ``run``'s node (None when it can)."""
        node_rank = run.command.node_rank
        if node_rank is not None and event.get("node_rank") != node_rank:
            return f"it names node {event.get('node_rank')}, it came from node {node_rank}"
        rank = event.get("rank")
        ranks = self.plan.node(node_rank).ranks if node_rank is not None else range(self.plan.world_size)
        if rank is not None and rank not in ranks:
            return f"rank {rank} does not run there"
        return None

    def _on_started(self, run: NodeRun, event: Event) -> None:
        problem = "a second started event" if run.started else self._node_mismatch(run, event)
        if problem is None and run.command.node_rank is not None:
            ranks = {int(r) for r in event.fields["pids"]}
            if not ranks <= set(self.plan.node(run.command.node_rank).ranks):
                problem = f"pids for ranks {sorted(ranks)} of another node"
        if problem is not None:
            self._note(f"ignored a started event from {run.command.host}: {problem}")
            return
        run.started = True
        self.started_at[event.fields["node_rank"]] = time.time()
        if not run.command.remote:  # only pids /proc shows to be this agent's children are ever killed
            run.rank_groups = tuple(child_groups(run.proc.pid, list(event.fields["pids"].values())))

    def _on_failed(self, run: NodeRun, event: Event) -> None:
        problem = self._node_mismatch(run, event)
        if problem is not None:
            self._note(f"ignored a failed event from {run.command.host}: {problem}")
            return
        run.reported = True
        failure = Failure.from_event(event.fields)
        self.failures.append(failure)
        if len(self.failures) == 1:
            self._note(f"rank {failure.rank} on {failure.host} failed ({failure.describe_code()}); stopping every node")
            self.stop_all()

    def _on_exit(self, run: NodeRun) -> None:
        for t in run.readers:
            t.join(timeout=2.0)  # drain: a 'failed' event may still be in the pipe
        self._drain_events()
        rc = run.proc.returncode
        if rc != 0:
            run.kill_ranks()  # a local agent that died (SIGKILL, OOM) leaves its ranks to us
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
        """The handler: only a put on a SimpleQueue (reentrant; no lock the interrupted code may hold)."""
        self.signals.put(signum)

    def _handle_signals(self) -> None:
        """Act on the signals received since the last call (the main loop's side of the handler)."""
        while not self.signals.empty():
            signum = self.signals.get()
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
                if not self.signals.empty():  # a signal mid-start: no further node starts
                    break
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
            self._handle_signals()
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
            if self.watch is not None:
                self.watch.tick(self)
        self._handle_signals()
        self._drain_events()

    def _exit_code(self) -> int:
        if self.watch is not None and self.watch.exit_code is not None:
            return self.watch.exit_code  # the run stalled and was stopped
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
