"""Stall diagnosis: when no rank has made progress for the stall timeout, which rank is
elsewhere, and where.

The launcher asks every rank for its Python stacks (faulthandler, on a signal: it answers
from C even in a collective or a busy loop), groups the ranks by (the collective they
wait in, their innermost frames) and names the minority groups as culprits against the
largest one::

    stalled: rank 2 (localhost) is in forward at train.py:41; ranks 0,1,3 wait in all_gather #18 (8192 fp32) at train.py:40

The timeout (:class:`StallPolicy`): once a rank waits in a collective that a peer has not
entered (not in any, or in another), ``--stall_timeout``, in any phase, set-up included: a
rank that sleeps after ``initialize()`` while its peer waits in the first all-gather is
named after the stall timeout, not after the set-up allowance. Otherwise, until every rank
has finished its first step (set-up, loading, first-step compilation: every rank outside
the collectives) the allowance is ``--setup_timeout``; after that
``--stall_timeout`` seconds, by default derived from the observed step times (20 times the
median step, at least 60 s, at most 20 minutes: far below NCCL's 30-minute watchdog, far
above a healthy step). A checkpoint's file I/O counts as progress (:mod:`launcher.watch.heartbeats`).
While no rank waits in one of the engine's collectives (every rank in the script's own code)
the set-up allowance holds too: nothing of the job waits on a peer there.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from launcher.watch.heartbeats import Board, RankStatus

STALL_EXIT = 124
"""The launcher's exit status after tearing down a stalled run (as ``timeout(1)``'s)."""
AUTO_FACTOR, AUTO_FLOOR_S, AUTO_CAP_S = 20.0, 60.0, 1200.0
DEFAULT_SETUP_S = 600.0
_FRAME = re.compile(r'^\s*File "(?P<file>.*)", line (?P<line>\d+) in (?P<func>.*)$')
_LIBRARY = re.compile(r"(site-packages|dist-packages|/lib/python3[.\d]*/|/zerorun/|/launcher/|<frozen )")


@dataclass(frozen=True)
class StallPolicy:
    timeout_s: float | None = None
    """``--stall_timeout`` seconds (None: auto, from the step times)."""
    setup_s: float = DEFAULT_SETUP_S
    """Allowance before every rank has finished a step."""

    def limit(self, board: Board) -> float:
        alive = board.alive()
        allowance = max(self.setup_s, self.timeout_s or 0.0)
        if any(s.phase.startswith("exiting") for s in alive):  # "exiting", "exiting after an error"
            return allowance
        if peer_missing(alive):  # a rank waits on a peer that is not in its collective: a stall in any phase
            return self.stall_s(board)
        if not board.all_stepped() or not any(s.waiting_in() for s in alive):
            # every rank outside the engine's collectives: set-up (loading, compiling), or the script's own
            # work (an evaluation or generation on the bare module, a data load) that may outlast many steps
            return allowance
        return self.stall_s(board)

    def stall_s(self, board: Board) -> float:
        """``--stall_timeout``, or auto: 20x the median step (the floor before any step)."""
        if self.timeout_s is not None:
            return self.timeout_s
        step = board.median_step_s(last=50) or 0.0
        return min(AUTO_CAP_S, max(AUTO_FLOOR_S, AUTO_FACTOR * step))


def peer_missing(alive: list[RankStatus]) -> bool:
    """Whether some rank waits in a collective that another live rank is not in (not in any, or in another).

    Ranks all in the same collective wait on the network or on a peer outside the job; ranks all
    outside collectives are loading or compiling: the set-up allowance is for those only."""
    waits = [s.waiting_in() for s in alive]
    return any(w is not None for w in waits) and len({None if w is None else w[0] for w in waits}) > 1


@dataclass(frozen=True)
class Frame:
    file: str
    line: int
    func: str

    def short(self) -> str:
        return f"{self.file.rsplit('/', 1)[-1]}:{self.line}"


def parse_stacks(lines: list[str]) -> list[list[Frame]]:
    """faulthandler's dump -> each thread's frames, innermost first."""
    threads: list[list[Frame]] = []
    for line in lines:
        if line.startswith(("Thread ", "Current thread ")):
            threads.append([])
        elif (m := _FRAME.match(line)) and threads:
            threads[-1].append(Frame(m["file"], int(m["line"]), m["func"]))
    return threads


def main_thread(threads: list[list[Frame]]) -> list[Frame]:
    """The thread running the script: the one whose outermost frame is a module's top level."""
    for frames in threads:
        if frames and frames[-1].func == "<module>":
            return frames
    return next((f for f in threads if f and not any("heartbeat" in x.file for x in f)), [])


def user_frame(frames: list[Frame]) -> Frame | None:
    """The innermost frame of the script's own code (not torch, not zerorun, not the stdlib)."""
    return next((f for f in frames if not _LIBRARY.search(f.file)), frames[0] if frames else None)


@dataclass
class RankPlace:
    """Where one rank is, for the verdict."""

    rank: int
    host: str
    phase: str
    waiting: list[Any] | None
    frames: list[Frame] = field(default_factory=list)
    stack: list[str] = field(default_factory=list)
    alive: bool = True

    def key(self) -> tuple[Any, ...]:
        where = user_frame(self.frames)
        coll = tuple(self.waiting) if self.waiting else None
        return (coll, where.short() if where else None, self.phase if not coll else None, self.alive)

    def where(self) -> str:
        f = user_frame(self.frames)
        return f" at {f.short()}" if f else ""


def place_of(status: RankStatus, stack: list[str] | None) -> RankPlace:
    frames = main_thread(parse_stacks(stack or []))
    return RankPlace(status.rank, status.host, status.phase, status.waiting_in(), frames, stack or [], status.alive)


def rank_list(ranks: list[int]) -> str:
    """``0-2,4-7``"""
    ranks, out, i = sorted(ranks), [], 0
    while i < len(ranks):
        j = i
        while j + 1 < len(ranks) and ranks[j + 1] == ranks[j] + 1:
            j += 1
        out.append(str(ranks[i]) if j == i else f"{ranks[i]}-{ranks[j]}" if j > i + 1 else f"{ranks[i]},{ranks[j]}")
        i = j + 1
    return ",".join(out)


def _size(n: int) -> str:
    return f"{n / 1e6:.1f}M" if n >= 1_000_000 else f"{n / 1e3:.1f}K" if n >= 10_000 else str(n)


def describe_group(places: list[RankPlace], label: str | None = None) -> str:
    p = places[0]
    who = ("rank " if len(places) == 1 else "ranks ") + rank_list([x.rank for x in places])
    if len(places) == 1:
        who += f" ({p.host})"
    if not p.alive:
        return f"{who} exited"
    if p.waiting:
        seq, kind, n, dtype = p.waiting[:4]
        unit = f", unit {label}" if label else ""
        return f"{who} wait{'s' if len(places) == 1 else ''} in {kind} #{seq} ({_size(int(n))} {dtype}{unit}){p.where()}"
    return f"{who} {'is' if len(places) == 1 else 'are'} in {p.phase}{p.where()}"


@dataclass
class Verdict:
    text: str
    culprits: list[int]
    groups: list[list[RankPlace]]
    stalled_for_s: float
    limit_s: float

    def to_json(self) -> dict[str, Any]:
        return {
            "verdict": self.text, "culprits": self.culprits, "stalled_for_s": round(self.stalled_for_s, 1),
            "stall_timeout_s": round(self.limit_s, 1),
            "groups": [{"ranks": [p.rank for p in g], "culprit": g[0].rank in self.culprits,
                        "collective": dict(zip(("seq", "kind", "elements", "dtype"), g[0].waiting[:4], strict=True))
                        if g[0].waiting else None,
                        "phase": g[0].phase, "where": (f.short() if (f := user_frame(g[0].frames)) else None),
                        "frames": [f"{x.file}:{x.line} in {x.func}" for x in g[0].frames[:8]]} for g in self.groups],
            "stacks": {str(p.rank): p.stack for g in self.groups for p in g},
        }


def verdict(places: list[RankPlace], stalled_for_s: float, limit_s: float, labels: dict[int, str] | None = None) -> Verdict:
    """Group the ranks; the largest group (the lowest rank's on a tie) waits, the others are culprits."""
    groups: dict[tuple[Any, ...], list[RankPlace]] = {}
    for p in sorted(places, key=lambda x: x.rank):
        groups.setdefault(p.key(), []).append(p)
    ordered = sorted(groups.values(), key=lambda g: (-len(g), g[0].rank))
    labels = labels or {}
    if len(ordered) == 1:
        text = (f"stalled: {describe_group(ordered[0], labels.get(ordered[0][0].rank))}: every rank is at the same "
                "point (a peer outside the job, the network, or a wait without end in the script)")
        return Verdict(text, [], ordered, stalled_for_s, limit_s)
    waiting, others = ordered[0], ordered[1:]
    # a rank outside any collective is the likelier culprit than one in a collective of its own
    others.sort(key=lambda g: (g[0].waiting is not None, g[0].rank))
    parts = [describe_group(g, labels.get(g[0].rank)) for g in others]
    text = "stalled: " + "; ".join(parts) + "; " + describe_group(waiting, labels.get(waiting[0].rank))
    culprits = sorted(p.rank for g in others for p in g)
    return Verdict(text, culprits, [*others, waiting], stalled_for_s, limit_s)


def stacks_text(places: list[RankPlace]) -> str:
    """The full stacks of every rank, for the log dir."""
    out = []
    for p in sorted(places, key=lambda x: x.rank):
        out.append(f"==== rank {p.rank} ({p.host}), phase {p.phase}, waiting in {p.waiting or 'no collective'}")
        out += p.stack or ["(no stacks: the rank sent no heartbeat with a stack channel, or did not answer)"]
        out.append("")
    return "\n".join(out)
