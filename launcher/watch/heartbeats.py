"""What the launcher knows of every rank while the job runs, from its agents' events: alive or
exited, the last heartbeat (phase, step, collectives, memory), the step times, and when the
rank last made progress.

Progress is a change in what a rank reports: its step or micro-step, its last completed
collective, its phase, a ``zerorun.progress`` call, or, in a checkpoint phase, its file
I/O (a long write is work). A rank that only stays alive (a beat with nothing new) makes
none. Pure bookkeeping: times are passed in, so tests drive it with synthetic beats.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field
from typing import Any

IO_PHASES = frozenset({"checkpoint-save", "checkpoint-load"})
STEP_HISTORY = 2000


@dataclass
class RankStatus:
    rank: int
    host: str
    node_rank: int
    pid: int | None = None
    alive: bool = True
    exit_code: int | None = None
    beat: dict[str, Any] | None = None
    last_beat_at: float | None = None
    last_progress_at: float | None = None
    steps: deque[tuple[int, float, float]] = field(default_factory=lambda: deque(maxlen=STEP_HISTORY))
    peak_rss: int = 0
    peak_device: int = 0
    steps_run: int = 0
    """Optimizer steps this launch ran (a resumed run's ``step`` is the global step, counted from before)."""
    _key: tuple[Any, ...] | None = None

    @property
    def step(self) -> int:
        return int(self.beat.get("step", 0)) if self.beat else 0

    @property
    def phase(self) -> str:
        return str(self.beat.get("phase", "?")) if self.beat else ("exited" if not self.alive else "starting")

    def median_step_s(self, last: int | None = None) -> float | None:
        times = [s for _, s, _ in list(self.steps)[-(last or len(self.steps)):]]
        return statistics.median(times) if times else None

    def median_busy_s(self, last: int | None = None) -> float | None:
        busy = [max(0.0, s - w) for _, s, w in list(self.steps)[-(last or len(self.steps)):]]
        return statistics.median(busy) if busy else None

    def memory(self) -> int:
        """Bytes now: the device's allocation on a GPU, else the resident set."""
        mem = (self.beat or {}).get("mem") or {}
        return int(mem.get("device_allocated") or mem.get("rss") or 0)

    def waiting_in(self) -> list[Any] | None:
        """``[seq, kind, elements, dtype]`` of the collective issued and not completed, else None."""
        beat = self.beat or {}
        issued, done = beat.get("issued"), beat.get("completed")
        if not issued or (done and done[0] >= issued[0]):
            return None
        return list(issued)


def progress_key(beat: dict[str, Any]) -> tuple[Any, ...]:
    done = beat.get("completed") or [0]
    io = beat.get("io") if beat.get("phase") in IO_PHASES else None
    return beat.get("step"), beat.get("micro"), done[0], beat.get("phase"), beat.get("marks"), io


class Board:
    """Every rank of one attempt."""

    def __init__(self, world_size: int, started_at: float) -> None:
        self.world_size = world_size
        self.started_at = started_at
        self.ranks: dict[int, RankStatus] = {}
        self.last_progress_at = started_at
        self.ended_at: float | None = None

    def started(self, node_rank: int, host: str, pids: dict[str, int], now: float) -> None:
        for rank, pid in pids.items():
            self.ranks[int(rank)] = RankStatus(int(rank), host, node_rank, pid=int(pid), last_progress_at=now)
        self.last_progress_at = now

    def on_beat(self, rank: int, beat: dict[str, Any], now: float) -> list[tuple[int, float, float]]:
        """Take one heartbeat; returns the step records it carried, ``(step, seconds, seconds waiting)``."""
        status = self.ranks.get(rank)
        if status is None:
            return []
        status.beat, status.last_beat_at = beat, now
        key = progress_key(beat)
        if key != status._key:
            status._key, status.last_progress_at, self.last_progress_at = key, now, now
        records = [(int(s), float(t), float(w)) for s, t, w in beat.get("steps") or []]
        status.steps.extend(records)
        status.steps_run += len(records)
        mem = beat.get("mem") or {}
        status.peak_rss = max(status.peak_rss, int(mem.get("peak_rss") or mem.get("rss") or 0))
        status.peak_device = max(status.peak_device, int(mem.get("device_peak") or 0))
        return records

    def on_exit(self, rank: int, exit_code: int, now: float) -> None:
        status = self.ranks.get(rank)
        if status is not None:
            status.alive, status.exit_code = False, exit_code
            self.last_progress_at = now

    def alive(self) -> list[RankStatus]:
        return [s for s in self.ranks.values() if s.alive]

    def all_stepped(self) -> bool:
        """Whether every running rank finished a step (then set-up and first-step compilation are over)."""
        running = self.alive()
        return bool(running) and all(s.steps or s.step > 0 for s in running)

    def step(self) -> int:
        """The furthest rank's step: ranks in lockstep differ only by when their last beat was sent
        (up to an interval, tens of steps of a fast model), and the script logs the step it is at."""
        return max((s.step for s in self.alive() or self.ranks.values()), default=0)

    def steps_run(self) -> int:
        """Steps this launch ran (the furthest rank's), not the global step of a resumed run."""
        return max((s.steps_run for s in self.ranks.values()), default=0)

    def median_step_s(self, last: int = 20) -> float | None:
        medians = [m for s in self.ranks.values() if (m := s.median_step_s(last)) is not None]
        return statistics.median(medians) if medians else None

    def slowest(self, last: int = 20) -> RankStatus | None:
        """The rank that computes longest per step (wall time less time waiting in collectives)."""
        timed = [(m, s) for s in self.ranks.values() if (m := s.median_busy_s(last)) is not None]
        return max(timed, key=lambda x: x[0])[1] if timed else None

    def rate(self, what: str) -> float | None:
        """Samples (``"samples"``) or tokens (``"tokens"``) per second over the job, when the engine knows."""
        beats = [s.beat for s in self.ranks.values() if s.beat]
        step_s = self.median_step_s()
        if not beats or not step_s:
            return None
        samples = beats[0].get("samples_per_step")
        if not samples:
            return None
        if what == "tokens":
            tokens = beats[0].get("tokens_per_sample")
            return samples * tokens / step_s if tokens else None
        return samples / step_s
