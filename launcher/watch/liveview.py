"""The live view: on a terminal a compact table that updates in place (rich), off a terminal a
plain line every ``--progress_every`` seconds, nothing with ``--quiet``.

One row per rank (per node past :data:`ROWS_PER_RANK_UP_TO` ranks): alive, step, s/step,
the rank's own work per step (``busy``: the step less its time blocked in collectives; the
slowest rank has the largest), phase, the collective it waits in, memory (device
allocation on a GPU, resident set on the CPU) and a flag for stragglers. The title holds
the job: step, s/step, samples/s (tokens/s when the engine knows the sequence length).
"""

from __future__ import annotations

import time
from typing import TextIO

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from launcher.watch.heartbeats import Board, RankStatus

ROWS_PER_RANK_UP_TO = 16
REFRESH_PER_S = 2


def size(n: int | float | None) -> str:
    if not n:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return "-"


def _secs(s: float | None) -> str:
    return "-" if s is None else f"{s:.3f}"


def headline(board: Board, now: float) -> str:
    step_s = board.median_step_s()
    parts = [f"{now - board.started_at:.0f} s", f"step {board.step()}",
             f"{_secs(step_s)} s/step" if step_s else "no step yet",
             f"{len(board.alive())}/{board.world_size} ranks alive"]
    if (tokens := board.rate("tokens")) is not None:
        parts.append(f"{tokens:,.0f} tokens/s")
    elif (samples := board.rate("samples")) is not None:
        parts.append(f"{samples:,.1f} samples/s")
    if (slow := board.slowest()) is not None and board.world_size > 1:
        parts.append(f"slowest rank {slow.rank} ({_secs(slow.median_busy_s(20))} s busy)")
    return " | ".join(parts)


def _waiting(s: RankStatus) -> str:
    w = s.waiting_in()
    return f"{w[1]} #{w[0]}" if w else ""


def rank_row(s: RankStatus, stragglers: set[int]) -> list[str]:
    state = "alive" if s.alive else f"exit {s.exit_code}"
    return [s.host, str(s.rank), state, str(s.step), _secs(s.median_step_s(20)), _secs(s.median_busy_s(20)),
            s.phase, _waiting(s), size(s.memory()), "straggler" if s.rank in stragglers else ""]


def node_row(ranks: list[RankStatus], stragglers: set[int]) -> list[str]:
    alive = sum(r.alive for r in ranks)
    slow = max(ranks, key=lambda r: r.median_busy_s(20) or 0.0)
    steps = [r.step for r in ranks]
    flagged = sorted(r.rank for r in ranks if r.rank in stragglers)
    return [ranks[0].host, f"{ranks[0].rank}-{ranks[-1].rank}", f"{alive}/{len(ranks)} alive",
            f"{min(steps)}" if min(steps) == max(steps) else f"{min(steps)}-{max(steps)}",
            _secs(slow.median_step_s(20)), f"{_secs(slow.median_busy_s(20))} (rank {slow.rank})", "", "",
            f"max {size(max(r.memory() for r in ranks))}", ",".join(map(str, flagged))]


def table(board: Board, stragglers: set[int], now: float) -> Group:
    """The headline, then the table (a headline of its own width: a title would wrap at the table's)."""
    t = Table(box=None, pad_edge=False)
    for col in ("node", "rank", "state", "step", "s/step", "busy s", "phase", "waits in", "memory", ""):
        t.add_column(col, justify="right" if col in ("step", "s/step", "busy s", "memory") else "left")
    ranks = [board.ranks[r] for r in sorted(board.ranks)]
    if len(ranks) <= ROWS_PER_RANK_UP_TO:
        for s in ranks:
            t.add_row(*rank_row(s, stragglers))
    else:
        for node in sorted({s.node_rank for s in ranks}):
            t.add_row(*node_row([s for s in ranks if s.node_rank == node], stragglers))
    return Group(Text(headline(board, now), no_wrap=True), t)


def plain_line(board: Board, stragglers: set[int], now: float) -> str:
    line = "zerorun: " + headline(board, now)
    if board.ranks:
        top = max(board.ranks.values(), key=lambda s: s.memory())
        line += f" | memory max {size(top.memory())} (rank {top.rank})"
    if stragglers:
        line += f" | stragglers: {','.join(map(str, sorted(stragglers)))}"
    return line


class LiveView:
    """Shows the board while the run goes: ``live`` (terminal), ``plain`` (every N seconds) or ``quiet``."""

    def __init__(self, mode: str, err: TextIO, every_s: float) -> None:
        self.mode = mode
        self.err = err
        self.every_s = every_s
        self.next_at = time.monotonic() + every_s
        self.live: Live | None = None

    @classmethod
    def choose(cls, quiet: bool, err: TextIO, every_s: float) -> LiveView:
        tty = hasattr(err, "isatty") and err.isatty()
        return cls("quiet" if quiet else "live" if tty else "plain", err, every_s)

    def start(self, board: Board, stragglers: set[int]) -> None:
        if self.mode == "live":
            console = Console(file=self.err)
            self.live = Live(Group(Text("zerorun: starting")), console=console, refresh_per_second=REFRESH_PER_S,
                             transient=False, redirect_stdout=False, redirect_stderr=False)
            self.live.start()

    def update(self, board: Board, stragglers: set[int], now: float) -> None:
        if self.live is not None:
            self.live.update(table(board, stragglers, now))
        elif self.mode == "plain" and time.monotonic() >= self.next_at:
            self.next_at = time.monotonic() + self.every_s
            print(plain_line(board, stragglers, now), file=self.err, flush=True)

    def note(self, text: str) -> None:
        """A line above the table (a straggler, a stall verdict)."""
        if self.live is not None:
            self.live.console.print(text, markup=False, highlight=False)
        else:
            print(text, file=self.err, flush=True)

    def stop(self) -> None:
        if self.live is not None:
            self.live.stop()
            self.live = None
