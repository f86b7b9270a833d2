"""The end-of-run summary: ranks, wall time, steps, median step time and peak memory per
rank, exit codes, stragglers, and where the logs are. Printed after every run, failed or not."""

from __future__ import annotations

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
    lines.append(f"  logs: {log_dir} (rank<R>.log)" if log_dir else "  logs: console only (pass --log_dir DIR for per-rank files)")
    lines.append("-" * 72)
    return "\n".join(lines)


def _f(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"
