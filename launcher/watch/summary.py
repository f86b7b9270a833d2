"""The end-of-run summary: ranks, wall time, steps, median step time and peak memory per
rank, exit codes, stragglers, and where the logs are. Printed after every run, failed or not.

A rank that fails after its script ended (its last heartbeat said it was exiting: the interpreter was
tearing down) is named as such: the training completed, the exit did not. It is still a failure
(schedulers and elastic restarts read the exit code), but the user learns the result is there.
"""

from __future__ import annotations

import signal

from launcher.watch.heartbeats import Board
from launcher.watch.liveview import size
from launcher.watch.stragglers import Straggler, describe


def summary(board: Board, ended_at: float, exit_code: int, stragglers: list[Straggler], log_dir: str | None) -> str:
    nodes = len({s.node_rank for s in board.ranks.values()})
    steps, global_step = board.steps_run(), max((s.step for s in board.ranks.values()), default=0)
    resumed = f" (to global step {global_step})" if global_step != steps else ""
    lines = ["-" * 72,
             f"zerorun: run summary: {board.world_size} rank(s) on {nodes} node(s), wall {ended_at - board.started_at:.1f} s, "
             f"{steps} step(s){resumed}, exit code {exit_code}",
             f"  {'rank':>4}  {'host':<16} {'steps':>6} {'median s/step':>13} {'busy s/step':>11} {'peak memory':>12} {'exit':>5}"]
    for r in sorted(board.ranks):
        s = board.ranks[r]
        peak = s.peak_device or s.peak_rss
        med, busy = s.median_step_s(), s.median_busy_s()
        exit_text = "-" if s.exit_code is None else str(s.exit_code)
        lines.append(f"  {r:>4}  {s.host[:16]:<16} {s.steps_run:>6} {_f(med):>13} {_f(busy):>11} {size(peak):>12} {exit_text:>5}")
    lines += [f"  {describe(s)}" for s in stragglers]
    lines += [f"  {note}" for note in teardown_failures(board)]
    lines.append(f"  logs: {log_dir} (rank<R>.log)" if log_dir else "  logs: console only (pass --log_dir DIR for per-rank files)")
    lines.append("-" * 72)
    return "\n".join(lines)


EXITING = "exiting"  # the phase a rank reports once its script has ended (zerorun.heartbeat)


def teardown_failures(board: Board) -> list[str]:
    """One line per rank that exited non-zero after its script ended (in its exit, not in training)."""
    notes = []
    for r in sorted(board.ranks):
        s = board.ranks[r]
        if s.exit_code in (None, 0) or s.phase != EXITING:
            continue
        notes.append(f"training completed (last step {s.step} reported) but rank {r} exited with "
                     f"{_code(s.exit_code)} at teardown, after its script ended: the run counts as failed")
    return notes


def _code(code: int) -> str:
    signum = -code if code < 0 else code - 128
    if signum > 0 and (code < 0 or code > 128) and signum in signal.valid_signals():
        return f"{code} ({signal.Signals(signum).name})"
    return str(code)


def _f(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"
