"""Watching a run: the agents' heartbeat events become the live view, straggler notes, the
stall verdict and the end-of-run summary.

The executor hands every agent event to :meth:`RunWatch.on_event` and calls
:meth:`RunWatch.tick` from its loop; the watch asks the agents for stacks and, on a stall,
stops the run (exit status :data:`~launcher.watch.stall.STALL_EXIT`) or, with ``--on_stall
report``, reports and keeps waiting (again at the next stall, once progress resumed).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, TextIO

from launcher.plan.runners import NodeCommand, PayloadMode
from launcher.protocol import Command
from launcher.watch.heartbeats import Board
from launcher.watch.liveview import LiveView
from launcher.watch.order import ORDER_EXIT, OrderWatch
from launcher.watch.stall import STALL_EXIT, StallPolicy, Verdict, place_of, stacks_text, verdict
from launcher.watch.stragglers import DEFAULT_FACTOR, DEFAULT_STEPS, StragglerTracker, describe
from launcher.watch.summary import summary

if TYPE_CHECKING:
    from launcher.protocol import Event


class NodeRun(Protocol):
    """What the watch needs of one started node command (launcher.run.executor.NodeRun)."""

    command: NodeCommand

    def send(self, cmd: Command, close: bool = False) -> None: ...


class Executor(Protocol):
    """What the watch needs of the run it watches (launcher.run.executor.Executor): its events, its
    node commands, and a way to stop them; the executor, in turn, only calls attach and tick."""

    runs: Sequence[NodeRun]
    stopping_since: float | None

    def on(self, kind: str, handler: Callable[[NodeRun, Event], None]) -> None: ...

    def stop_all(self) -> None: ...

WATCHED = ("started", "heartbeat", "stacks", "rank_exited", "failed")

STACK_WAIT_S = 4.0
"""How long the launcher waits for every rank's stacks before it judges with what it has."""


@dataclass(frozen=True)
class WatchOptions:
    quiet: bool = False
    progress_every_s: float = 30.0
    stall: StallPolicy = StallPolicy()
    on_stall: str = "stop"
    report_json: str | None = None
    log_dir: str | None = None
    straggler_factor: float = DEFAULT_FACTOR
    straggler_steps: int = DEFAULT_STEPS


class RunWatch:
    """The watch over one attempt of a run."""

    def __init__(self, opts: WatchOptions, world_size: int, job_id: str, err: TextIO | None = None) -> None:
        self.opts = opts
        self.job_id = job_id
        self.err = err or sys.stderr
        self.board = Board(world_size, time.time())
        self.tracker = StragglerTracker(world_size, opts.straggler_factor, opts.straggler_steps)
        tty = sys.stdout.isatty() and hasattr(self.err, "isatty") and self.err.isatty()
        self.view = LiveView("quiet" if opts.quiet else "live" if tty else "plain", self.err, opts.progress_every_s)
        self.exit_code: int | None = None
        self.stacks: dict[int, list[str]] | None = None
        self.stacks_deadline = 0.0
        self.reported_progress_at: float | None = None
        self.verdicts: list[Verdict] = []
        self.order = OrderWatch()

    def begin(self) -> None:
        self.view.start(self.board, set())

    def streams(self, out: TextIO, err: TextIO) -> tuple[TextIO, TextIO]:
        """Where the executor writes rank output: above the table in the live view."""
        if self.view.live is None:
            return out, err
        from rich.file_proxy import FileProxy

        console = self.view.live.console
        return FileProxy(console, out), FileProxy(console, err)  # type: ignore[return-value]

    # ---- events --------------------------------------------------------------------------------
    def attach(self, executor: Executor) -> None:
        for kind in WATCHED:
            executor.on(kind, self.on_event)

    def on_event(self, run: NodeRun, event: Event) -> None:
        kind, now = event.kind, time.time()
        node = event.get("node_rank")
        if kind == "started":
            self.board.started(int(node or 0), str(event.get("host", "?")), dict(event.get("pids") or {}), now)
            return
        rank = event.get("rank")
        status = self.board.ranks.get(rank) if isinstance(rank, int) else None
        if status is None or status.node_rank != node:  # an event for a rank this node does not run
            return
        if kind == "heartbeat" and isinstance(event.get("beat"), dict):
            records = self.board.on_beat(status.rank, dict(event.get("beat")), now)
            self.order.take(status.rank, self.board.ranks[status.rank].beat or {})
            for s in self.tracker.add(status.rank, status.host, records):
                self.view.note(f"zerorun: {describe(s)}")
        elif kind == "stacks" and self.stacks is not None:
            self.stacks[status.rank] = [str(x) for x in event.get("lines") or []]
        elif kind in ("rank_exited", "failed") and isinstance(event.get("exit_code"), int):
            self.board.on_exit(status.rank, int(event.get("exit_code")), now)

    # ---- the loop ------------------------------------------------------------------------------
    def tick(self, executor: Executor) -> None:
        now = time.time()
        self.view.update(self.board, set(self.tracker.current()), now)
        if self.exit_code is not None or executor.stopping_since is not None:
            return
        if (differs := self.order.mismatch(self.board)) is not None:  # launcher.watch.order
            self.view.note(f"zerorun: collective order differs between ranks: {differs}")
            self.view.note(f"zerorun: stopping every rank (exit status {ORDER_EXIT}): the collectives paired wrong "
                           "buffers; look for a branch on rank-dependent data before that point")
            self.exit_code = ORDER_EXIT
            executor.stop_all()
            return
        if self.stacks is not None:
            if len(self.stacks) >= len(self.board.alive()) or time.monotonic() > self.stacks_deadline:
                self._judge(executor, now)
            return
        if self.reported_progress_at == self.board.last_progress_at:
            return  # reported this stall already (--on_stall report): wait for progress
        limit = self.opts.stall.limit(self.board)
        if self.board.alive() and now - self.board.last_progress_at > limit:
            self.stacks, self.stacks_deadline = {}, time.monotonic() + STACK_WAIT_S
            for run in executor.runs:
                if run.command.payload is PayloadMode.STDIN:
                    run.send(Command.STACKS)

    def _judge(self, executor: Executor, now: float) -> None:
        stacks, self.stacks = self.stacks or {}, None
        places = [place_of(s, stacks.get(s.rank)) for s in self.board.ranks.values() if s.alive]
        if not places:  # every rank ended meanwhile: nothing is stalled
            return
        labels = {s.rank: str(s.beat["label"]) for s in self.board.ranks.values() if s.beat and s.beat.get("label")}
        limit = self.opts.stall.limit(self.board)
        v = verdict(places, now - self.board.last_progress_at, limit, labels)
        self.verdicts.append(v)
        where = self._write(v, places)
        self.view.note(f"zerorun: {v.text}")
        self.view.note(f"zerorun: no rank made progress for {v.stalled_for_s:.0f} s (stall timeout {limit:.0f} s); "
                       f"every rank's stacks: {where}")
        self.reported_progress_at = self.board.last_progress_at
        if self.opts.on_stall == "stop":
            self.view.note(f"zerorun: stopping every rank (exit status {STALL_EXIT}; --on_stall report keeps waiting)")
            self.exit_code = STALL_EXIT
            executor.stop_all()

    def _write(self, v: Verdict, places: list) -> str:
        folder = Path(self.opts.log_dir) if self.opts.log_dir else Path.cwd() / f"zerorun-stall-{self.job_id}"
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"stall-stacks-{len(self.verdicts)}.txt"
        path.write_text(v.text + "\n\n" + stacks_text(places))
        if self.opts.report_json:
            Path(self.opts.report_json).write_text(json.dumps(v.to_json(), indent=2) + "\n")
        return str(path)

    def end(self, exit_code: int) -> str:
        """Stop the view; the summary to print."""
        self.view.stop()
        return summary(self.board, time.time(), exit_code, list(self.tracker.flagged.values()), self.opts.log_dir)
