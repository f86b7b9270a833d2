"""``--max_restarts N``: after a failure, tear the whole gang down and start it again.

A restart is all or nothing: every rank on every node stops (the executor's teardown)
and every rank starts again, after a backoff that doubles from ``--restart_backoff``
seconds (capped at 60 s), so a node that needs a moment - a port in TIME_WAIT, a
filesystem catching up - gets it. The ranks see ``ZERORUN_RESTART_COUNT``; a script
that resumes calls ``engine.load_checkpoint(dir)``, which finds ``latest``. Every attempt
has its own job id and channel key (its own plan files, its own event channel). A run the
user stopped (Ctrl-C, SIGTERM) is never restarted.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TextIO

from launcher.errors import LaunchError
from launcher.plan.launch_plan import LaunchPlan, new_job_id
from launcher.plan.runners import NodeCommand
from launcher.protocol import new_key
from launcher.run.executor import Executor, RunResult
from launcher.watch.hints import Hint
from launcher.watch.report import Failure, format_report
from launcher.watch.watcher import RunWatch

RESTART_ENV = "ZERORUN_RESTART_COUNT"
MAX_BACKOFF_S = 60.0


@dataclass(frozen=True)
class RestartPolicy:
    """How often, and how patiently, a failed gang is started again."""

    max_restarts: int = 0
    """Restarts after the first attempt (0: a failure ends the run)."""
    backoff_s: float = 1.0
    """Seconds before the first restart; each further restart waits twice as long (at most 60 s)."""

    def __post_init__(self) -> None:
        if self.max_restarts < 0 or self.backoff_s < 0:
            raise LaunchError(f"--max_restarts {self.max_restarts} / --restart_backoff {self.backoff_s}: "
                              "negative values mean nothing here", "give --max_restarts N >= 0 and seconds >= 0")

    def delay(self, restart: int) -> float:
        """Seconds to wait before restart number ``restart`` (1-based)."""
        return min(self.backoff_s * 2 ** (restart - 1), MAX_BACKOFF_S)


def with_restart_count(plan: LaunchPlan, restart: int) -> LaunchPlan:
    """``plan`` whose ranks see ``ZERORUN_RESTART_COUNT=restart``."""
    env = dict(plan.env)
    env[RESTART_ENV] = str(restart)
    return dataclasses.replace(plan, env=tuple(sorted(env.items())))


def fresh_attempt(plan: LaunchPlan) -> LaunchPlan:
    """``plan`` with a new job id and channel key: a restart reuses no plan-file name and no key."""
    return dataclasses.replace(plan, job_id=new_job_id(), channel_key=new_key())


def _when(ts: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(ts)) + f".{int(ts * 1000) % 1000:03d}"


def restart_note(failure: Failure, restart: int, policy: RestartPolicy, ended: float) -> str:
    """The line that says which rank failed, when, and what happens next."""
    who = "the command" if failure.rank is None else f"rank {failure.rank}"
    return (f"zerorun: {who} on {failure.host} failed at {_when(failure.time)} ({failure.describe_code()}); "
            f"every rank stopped {ended - failure.time:.1f} s later; restart {restart}/{policy.max_restarts} "
            f"of every rank in {policy.delay(restart):.1f} s")


def run_watched(plan: LaunchPlan, commands: list[NodeCommand], watch_for: Callable[[LaunchPlan], RunWatch] | None,
                err: TextIO) -> tuple[Executor, RunResult]:
    """One attempt, with its live view and, at the end, its summary (launcher.watch.watcher)."""
    if watch_for is None:
        executor = Executor(plan, commands)
        return executor, executor.run()
    watch = watch_for(plan)
    watch.begin()
    out, err_stream = watch.streams(sys.stdout, sys.stderr)
    executor = Executor(plan, commands, out=out, err=err_stream, watch=watch)
    result = None
    try:
        result = executor.run()
    finally:
        print(watch.end(result.exit_code if result else 1), file=err, flush=True)
    return executor, result


def run_with_restarts(
    plan_for: Callable[[int], LaunchPlan],
    commands_for: Callable[[LaunchPlan], list[NodeCommand]],
    policy: RestartPolicy,
    err: TextIO | None = None,
    watch_for: Callable[[LaunchPlan], RunWatch] | None = None,
    before_restart: Callable[[RunResult, int], str | None] | None = None,
    hints: tuple[Hint, ...] = (),
) -> RunResult:
    """Run attempt 0, and up to ``policy.max_restarts`` more after failures; the last result.

    ``plan_for(n)`` is the plan of attempt ``n`` (the caller may pick a new free port, or
    other nodes). ``before_restart(result, n)``, called before restart ``n``, returns a line
    to print after the restart note ("" for none), or None to give up (having said why):
    launcher/elastic/supervisor.py picks the next members there. ``hints``: the launch's own, for the report.
    """
    err = err or sys.stderr
    restart = 0
    while True:
        plan = plan_for(restart) if restart == 0 else fresh_attempt(plan_for(restart))
        if policy.max_restarts:
            plan = with_restart_count(plan, restart)
        executor, result = run_watched(plan, commands_for(plan), watch_for, err)
        if result.failures:
            print(format_report(result.failures, plan.world_size, console=executor.once,
                                logs_said=watch_for is not None, hints=hints), file=err, flush=True)
        if not result.failures or result.interrupted or restart >= policy.max_restarts:
            if result.failures and policy.max_restarts and not result.interrupted:
                print(f"zerorun: giving up after {restart} restart(s) (--max_restarts {policy.max_restarts})",
                      file=err, flush=True)
            return result
        restart += 1
        line = "" if before_restart is None else before_restart(result, restart)
        if line is None:
            return result
        print(restart_note(result.failures[0], restart, policy, time.time()), file=err, flush=True)
        if line:
            print(line, file=err, flush=True)
        try:
            time.sleep(policy.delay(restart))
        except KeyboardInterrupt:  # Ctrl-C during the backoff: stop here, nothing is running
            print("zerorun: interrupted before the restart; nothing is running", file=err, flush=True)
            return dataclasses.replace(result, exit_code=130, interrupted=True)
