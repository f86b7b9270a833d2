"""World-2 jobs back to back, each rank a fresh process that ends as a script does (it returns and the
interpreter finalizes); one JSON line per rank: its exit code, whether it hung, printed "terminate
called", finished its steps, and which threads were alive at its last exit handler.

    python tests/engine/exit_rounds.py --rounds 7                     # ddp,z1,z2,z3,readme x 7 = 35 runs
    python tests/engine/exit_rounds.py --runs ddp:nothing,z2:abort    # runs given one by one

The ranks are forked from this process, a fork server in the way of multiprocessing's
``forkserver``: a clean interpreter that imports torch, ``torch._dynamo`` and the engine once
(:mod:`exit_jobs`, the ~5 s of CPU a rank would otherwise pay), runs no tensor operation, and checks
before every fork that it has one thread (``threading.active_count() == 1`` and one entry in
``/proc/self/task``): a fork then inherits no lock another thread could hold (with OpenMP's and
OpenBLAS's pools kept at one thread, torch's import starts none). Unlike multiprocessing's children,
which leave by ``os._exit`` and skip it, a rank here leaves by ``SystemExit``, unwinding to the top of
this script: atexit handlers, module teardown and C++ static destructors run as after any script.
So no frame above a fork (``main``, ``run_plan``, ``_start``) may hold a ``try``, ``with`` or
``finally`` that would run in the child. Each run has a deadline: a rank still alive at it is reported
as hung, with its threads' states and Python stacks (faulthandler on SIGUSR1), and killed with its
peer. ``--probe`` uses torch-free stand-in jobs: the checker's own test.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from launcher.plan.port import free_port

ONE_THREAD_ENV = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
SYSTEMS = ("ddp", "z1", "z2", "z3", "readme")
ENDINGS = ("nothing", "destroy", "group")
THREADS_TAG = "EXIT-THREADS "
WORLD = 2


@dataclasses.dataclass(frozen=True)
class Run:
    """One world-2 job: which system, how its script ends, whose group it trains on."""

    index: int
    system: str
    ending: str
    user_group: bool = False
    keep_group: bool = False
    steps: int = 2


def plan(rounds: int, systems: tuple[str, ...] = SYSTEMS, steps: int = 2) -> list[Run]:
    """``rounds`` x ``systems``, back to back; the ``i``-th run ends the ``i``-th way of :data:`ENDINGS`
    and a zerorun system trains on a group its script created every other round (the README's job
    runs as its script does: ending with nothing, on zerorun's group)."""
    runs = []
    for r in range(rounds):
        for k, system in enumerate(systems):
            i = len(runs)
            tiny = system != "readme"
            runs.append(Run(i, system, ENDINGS[i % len(ENDINGS)] if tiny else "nothing",
                            user_group=tiny and (r + k) % 2 == 1, steps=steps if tiny else 3))
    return runs


def thread_names(pid: int | str = "self") -> list[str]:
    """The names of a process's threads (``/proc/PID/task/*/comm``)."""
    names = []
    for tid in _listdir(f"/proc/{pid}/task"):
        names.append(_read(f"/proc/{pid}/task/{tid}/comm").strip())
    return sorted(names)


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def _read(path: str) -> str:
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def assert_one_thread() -> None:
    """Raise unless this process has exactly one thread (what a fork may safely copy)."""
    tasks = _listdir("/proc/self/task")
    if threading.active_count() != 1 or len(tasks) != 1:
        raise RuntimeError(f"the fork server has {len(tasks)} threads {thread_names()} "
                           f"({threading.active_count()} Python threads): a forked rank could inherit a held lock")


def _threads_at_exit() -> None:
    """Registered first, so it runs last: the threads still alive when the interpreter finalizes."""
    print(THREADS_TAG + json.dumps(thread_names()), flush=True)


def _probe(spec: Mapping[str, Any], rank: int) -> None:
    """Torch-free stand-ins for a job (the checker's test): ``nothing`` exits 0; ``abort``: rank 1 aborts
    after its last step; ``hang``: rank 0 never returns; ``terminate``: rank 1 prints torch's abort line
    and exits 0; ``fail``: rank 0 raises."""
    print("EXIT-STEPS-DONE", flush=True)
    ending = spec["ending"]
    if ending == "abort" and rank == 1:
        os.abort()
    if ending == "hang" and rank == 0:
        while True:  # one long sleep: a loaded machine's report then finds it inside the kernel's wait
            time.sleep(3600)
    if ending == "terminate" and rank == 1:
        print("terminate called without an active exception", file=sys.stderr, flush=True)
    if ending == "fail" and rank == 0:
        raise RuntimeError("a rank's own error")


def preload(probe: bool) -> Mapping[str, Callable[[Mapping[str, Any], int], None]]:
    """Import what every rank needs, once (torch-free for ``probe``); the jobs by system."""
    os.environ.update(ONE_THREAD_ENV)
    if probe:
        return {"probe": _probe}
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import exit_jobs

    return exit_jobs.JOBS


def _rank(job: Callable[[Mapping[str, Any], int], None], run: Run, rank: int, log: str, env: dict[str, str]) -> None:
    """In the forked child: output to ``log``, the job, then ``SystemExit`` up to the top of the script."""
    import atexit
    import faulthandler

    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)  # the server asks on a hang
    os.environ.update(env)
    atexit.register(_threads_at_exit)
    job(dataclasses.asdict(run), rank)
    raise SystemExit(0)  # the interpreter finalizes as after any script


def _start(job: Callable[[Mapping[str, Any], int], None], run: Run, logdir: str) -> dict[int, tuple[int, str]]:
    """Fork the run's ranks (from a one-thread process); returns ``{pid: (rank, log)}``."""
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "WORLD_SIZE": str(WORLD),
           "LOCAL_WORLD_SIZE": str(WORLD), "PYTHONWARNINGS": "ignore", **ONE_THREAD_ENV}
    children = {}
    for rank in range(WORLD):
        log = os.path.join(logdir, f"{run.index}-{run.system}-{rank}.log")
        assert_one_thread()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _rank(job, run, rank, log, {**env, "RANK": str(rank), "LOCAL_RANK": str(rank)})
        children[pid] = (rank, log)
    return children


def _hang_report(pid: int) -> dict[str, Any]:
    """A hung rank's threads (name, state, kernel wait) and, via faulthandler, its Python stacks."""
    threads = []
    for tid in sorted(_listdir(f"/proc/{pid}/task")):
        stat = _read(f"/proc/{pid}/task/{tid}/stat").rsplit(")", 1)[-1].split()
        threads.append(f"{_read(f'/proc/{pid}/task/{tid}/comm').strip()}:{stat[0] if stat else '?'}:"
                       f"{_read(f'/proc/{pid}/task/{tid}/wchan') or '?'}")
    with contextlib.suppress(OSError):
        os.kill(pid, signal.SIGUSR1)
    time.sleep(0.5)
    report: dict[str, Any] = {"threads": threads}
    if os.environ.get("EXIT_ROUNDS_GDB") and shutil.which("gdb"):  # by hand: the native stacks too
        gdb = subprocess.run(["gdb", "-p", str(pid), "-batch", "-ex", "thread apply all bt 30"],
                             capture_output=True, text=True, timeout=300)
        report["gdb"] = [line for line in gdb.stdout.splitlines() if line.startswith(("#", "Thread"))]
    return report


def wait_run(children: dict[int, tuple[int, str]], timeout: float) -> dict[int, dict[str, Any]]:
    """Wait for a run's ranks until ``timeout``; a rank alive then is hung: described, then killed with
    every rank of the run still alive. Returns ``{rank: {"exit", "hung", "hang", "log"}}``."""
    deadline = time.monotonic() + timeout
    out: dict[int, dict[str, Any]] = {}
    alive = dict(children)
    while alive and time.monotonic() < deadline:
        for pid in list(alive):
            got, status, usage = os.wait4(pid, os.WNOHANG)
            if got:
                rank, log = alive.pop(pid)
                out[rank] = {"exit": os.waitstatus_to_exitcode(status), "hung": False, "log": log, "pid": pid,
                             "cpu_s": round(usage.ru_utime + usage.ru_stime, 2)}
        time.sleep(0.01)
    reports = {pid: _hang_report(pid) for pid in alive}
    for pid, (rank, log) in alive.items():
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        out[rank] = {"exit": None, "hung": True, "hang": reports[pid], "log": log, "pid": pid}
    return out


def record(run: Run, rank: int, result: Mapping[str, Any]) -> dict[str, Any]:
    """One rank's JSON record, read from its log."""
    text = _read(result["log"])
    threads = [json.loads(line[len(THREADS_TAG):]) for line in text.splitlines() if line.startswith(THREADS_TAG)]
    spec = {k: v for k, v in dataclasses.asdict(run).items() if k != "index"}
    return {**spec, "run": run.index, "rank": rank, "pid": result["pid"], "exit": result["exit"], "hung": result["hung"],
            "terminate": "terminate called" in text, "finished": "EXIT-STEPS-DONE" in text,
            "threads": threads[-1] if threads else None, "hang": result.get("hang"), "cpu_s": result.get("cpu_s"),
            "tail": text.strip().splitlines()[-40 if result["hung"] else -4:]}


def run_plan(runs: list[Run], probe: bool, timeout: float, logdir: str, freeze: bool = True) -> int:
    """Every run in turn, one JSON line per rank on stdout; stops after a hung run. Returns the bad count.

    ``freeze``: the preloaded objects go to the collector's permanent generation (``gc.freeze()``), so a
    rank's final collection skips them: ~1 s of CPU a rank less (its ~1.2 s finalization becomes
    ~0.3 s). A run's own objects (its engine, groups, works, tensors) are made after the fork and
    are collected as in any script; only a cycle through an import-time object would now outlive
    the interpreter (``--no-freeze`` runs without it, by hand)."""
    jobs = preload(probe)
    if freeze:
        gc.freeze()
    os.makedirs(logdir, exist_ok=True)
    bad = 0
    for run in runs:
        start = time.monotonic()
        results = wait_run(_start(jobs["probe" if probe else run.system], run, logdir), timeout)
        for rank in sorted(results):
            rec = record(run, rank, results[rank])
            rec["seconds"] = round(time.monotonic() - start, 2)
            bad += rec["exit"] != 0 or rec["terminate"]
            print(json.dumps(rec), flush=True)
        if any(r["hung"] for r in results.values()):
            print(json.dumps({"stopped": f"run {run.index} hung"}), flush=True)
            break
    return bad


def _parse_runs(text: str, steps: int) -> list[Run]:
    out = []
    for i, item in enumerate(filter(None, text.split(","))):
        system, *rest = item.split(":")
        ending, flags = (rest[0], rest[1:]) if rest else ("nothing", [])
        out.append(Run(i, system, ending, user_group="user" in flags, steps=steps))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--systems", default=",".join(SYSTEMS))
    p.add_argument("--runs", default=None, help="SYSTEM[:ENDING[:user]],... instead of --rounds x --systems")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--keep-script-groups", action="store_true",
                   help="a group the script created stays alive into finalization (outside torch's contract)")
    p.add_argument("--probe", action="store_true", help="torch-free stand-in jobs (the checker's test)")
    p.add_argument("--run-timeout", type=float, default=60.0, help="seconds a run may take before it is hung")
    p.add_argument("--logdir", default=None)
    p.add_argument("--no-freeze", action="store_true", help="no gc.freeze() of the preloaded objects (slower)")
    a = p.parse_args()
    runs = _parse_runs(a.runs, a.steps) if a.runs else plan(a.rounds, tuple(a.systems.split(",")), a.steps)
    if a.keep_script_groups:
        runs = [dataclasses.replace(r, keep_group=True) for r in runs]
    bad = run_plan(runs, a.probe, a.run_timeout, a.logdir or tempfile.mkdtemp(prefix="zerorun-exit-"),
                   freeze=not a.no_freeze)
    raise SystemExit(1 if bad else 0)


if __name__ == "__main__":
    main()
