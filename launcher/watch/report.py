"""The end-of-run summary of a failed launch: the root cause (first observed failure)
first, then every other failure, in the spirit of torchelastic's report."""

from __future__ import annotations

import signal
import time
from dataclasses import dataclass, field
from typing import Any

from launcher.watch.hints import Hint, hint_for
from launcher.watch.once import OnceFilter, text_of
from launcher.watch.raised import raised


@dataclass(frozen=True)
class Failure:
    """A failure seen by the launcher: a rank's (from its agent) or a whole node's."""

    host: str
    node_rank: int | None
    exit_code: int
    time: float
    rank: int | None = None
    local_rank: int | None = None
    signal: str | None = None
    stderr_tail: tuple[str, ...] = field(default_factory=tuple)
    log_path: str | None = None

    @classmethod
    def from_event(cls, event: dict[str, Any]) -> Failure:
        return cls(
            host=str(event.get("host", "?")), node_rank=event.get("node_rank"), exit_code=int(event["exit_code"]),
            time=float(event.get("time", time.time())), rank=event.get("rank"), local_rank=event.get("local_rank"),
            signal=event.get("signal"), stderr_tail=tuple(event.get("stderr_tail") or ()),
            log_path=event.get("log_path"),
        )

    def describe_code(self) -> str:
        name = self.signal
        if name is None and self.exit_code > 128 and self.exit_code - 128 in signal.valid_signals():
            try:
                name = signal.Signals(self.exit_code - 128).name
            except ValueError:
                name = None
        if name is None:
            return f"exit code {self.exit_code}"
        hint = " (killed: out of memory? check dmesg)" if name == "SIGKILL" else ""
        return f"exit code {self.exit_code} = 128+{self.exit_code - 128} ({name}){hint}"


def _when(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def format_report(failures: list[Failure], world_size: int, tail_lines: int = 10,
                  console: OnceFilter | None = None, logs_said: bool = False, hints: tuple[Hint, ...] = ()) -> str:
    """The summary printed at the end of a failed run (root cause = ``failures[0]``).

    ``console`` is what reached the console: a stderr tail printed there already is not
    repeated (each message once), the box points at it instead. ``logs_said``: the run
    summary above already said the logs are on the console only. ``hints``: this launch's own
    (launcher.watch.hints), before the fixed ones. A traceback in the tail is quoted by its
    exception line and the frame that raised it (launcher.watch.raised)."""
    if not failures:
        return ""
    root = failures[0]
    where = f"{root.host}" + (f" (node {root.node_rank})" if root.node_rank is not None else "")
    who = "the node's agent" if root.rank is None else f"{root.rank} of {world_size} (local rank {root.local_rank})"
    lines = [
        "=" * 72,
        "zerorun: the run failed",
        "Root cause (first observed failure):",
        f"  host      : {where}",
        f"  rank      : {who}",
        f"  status    : {root.describe_code()}",
        f"  time      : {_when(root.time)}",
    ]
    if root.log_path or not logs_said:
        lines.append(f"  logs      : {root.log_path or 'console only (pass --log_dir DIR for per-rank files)'}")
    lines += _error_lines(root.stderr_tail, tail_lines, console)
    hint = hint_for(root.stderr_tail, hints)
    if hint:
        lines.append(f"  hint      : {hint}")
    lines += _others(failures, root)
    lines.append("=" * 72)
    return "\n".join(lines)


def _error_lines(stderr_tail: tuple[str, ...], tail_lines: int, console: OnceFilter | None) -> list[str]:
    """The root's error: its exception line and where it was raised (when its tail holds a traceback),
    and its last stderr lines unless they reached the console already (then: by which ranks)."""
    tail = stderr_tail[-tail_lines:]
    exception = raised(stderr_tail)
    printed = bool(tail) and console is not None and all(console.printed(text) for text in tail)
    ranks = (", ".join(map(str, console.ranks(tail[-1]))) or "?") if printed and console is not None else ""
    lines = [] if exception is None else [f"  error     : {exception.line}"]
    if exception is not None and exception.where:
        lines.append(f"  raised at : {exception.where}" + (f" (traceback above, by rank(s) {ranks})" if printed else ""))
    if printed:
        return lines if exception is not None else [f"  error     : printed above (by rank(s) {ranks})"]
    if not tail:
        return [*lines, "  stderr    : (empty)"]
    return [*lines, f"  last {len(tail)} lines of its stderr:", *(f"    {text}" for text in tail)]


def _others(failures: list[Failure], root: Failure) -> list[str]:
    """One line per other failure; ranks that failed with the root's own error share one line.

    A bad input every rank reads (a missing file, a wrong key) fails all of them the
    same way: the error is shown once, above, and the others are only counted.
    """
    last = text_of(root.stderr_tail[-1]) if root.stderr_tail else None
    same = [f for f in failures[1:] if f.stderr_tail and text_of(f.stderr_tail[-1]) == last
            and f.exit_code == root.exit_code]
    lines = []
    if same:
        ranks = ", ".join("agent" if f.rank is None else str(f.rank) for f in same)
        lines.append(f"Also failed with the same error ({root.describe_code()}): rank(s) {ranks}")
    for other in failures[1:]:
        if other in same:
            continue
        rank = "agent" if other.rank is None else f"rank {other.rank}"
        last = f": {other.stderr_tail[-1]}" if other.stderr_tail else ""
        lines.append(f"Also failed: {other.host} {rank}: {other.describe_code()} at {_when(other.time)}{last}")
    return lines
