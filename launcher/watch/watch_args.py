"""The launcher's options for watching a run (the live view, stalls, stragglers), defined once
here and added to the parser's "watching the run" group."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from launcher.errors import LaunchError
from launcher.plan.launch_plan import LaunchPlan
from launcher.watch.stall import DEFAULT_SETUP_S, STALL_EXIT, StallPolicy
from launcher.watch.stragglers import DEFAULT_FACTOR, DEFAULT_STEPS
from launcher.watch.watcher import RunWatch, WatchOptions


def add_watch_options(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--quiet", "-q", action="store_true", help="no live view, no progress lines (the summary stays)")
    group.add_argument("--progress_every", type=float, default=30.0, metavar="S",
                       help="off a terminal: a progress line every S seconds (default 30)")
    group.add_argument("--stall_timeout", default="auto", metavar="S",
                       help="seconds without progress on every rank before the stall diagnosis; auto (default): "
                            "20x the median step time, 60 s to 20 min")
    group.add_argument("--setup_timeout", type=float, default=DEFAULT_SETUP_S, metavar="S",
                       help="the same allowance until every rank has finished its first step (set-up, "
                            "first-step compilation), while a rank exits, and while no rank waits in a collective "
                            f"of the engine (the script's own work; default {DEFAULT_SETUP_S:.0f}); never while a rank "
                            "waits in a collective a peer has not entered (then --stall_timeout, in any phase)")
    group.add_argument("--on_stall", choices=["stop", "report"], default="stop",
                       help=f"after a stall verdict: stop every rank, exit status {STALL_EXIT} (default), or report "
                            "and keep waiting")
    group.add_argument("--report_json", metavar="FILE", help="write each stall verdict as JSON to FILE")
    group.add_argument("--straggler_factor", type=float, default=DEFAULT_FACTOR, metavar="K",
                       help=f"a straggler's own work per step exceeds K x the median rank's (default {DEFAULT_FACTOR:g})")
    group.add_argument("--straggler_steps", type=int, default=DEFAULT_STEPS, metavar="M",
                       help=f"... for M steps in a row (default {DEFAULT_STEPS})")


def watch_options(ns: argparse.Namespace) -> WatchOptions:
    text = str(ns.stall_timeout)
    try:
        timeout = None if text == "auto" else float(text)
    except ValueError:
        timeout = -1.0
    if timeout is not None and timeout <= 0:
        raise LaunchError(f"--stall_timeout {text!r} is not a number of seconds", "give seconds > 0, or auto")
    if ns.progress_every <= 0 or ns.setup_timeout <= 0 or ns.straggler_factor <= 1 or ns.straggler_steps < 1:
        raise LaunchError("--progress_every and --setup_timeout must be > 0, --straggler_factor > 1, "
                          "--straggler_steps >= 1", "check the values of those options")
    return WatchOptions(quiet=ns.quiet, progress_every_s=ns.progress_every,
                        stall=StallPolicy(timeout, max(ns.setup_timeout, timeout or 0.0)), on_stall=ns.on_stall,
                        report_json=ns.report_json, log_dir=ns.log_dir, straggler_factor=ns.straggler_factor,
                        straggler_steps=ns.straggler_steps)


def watch_factory(ns: argparse.Namespace) -> Callable[[LaunchPlan], RunWatch]:
    """Checks the options now (before any rank starts); a fresh watch for each attempt."""
    opts = watch_options(ns)
    return lambda plan: RunWatch(opts, plan.world_size, plan.job_id)
