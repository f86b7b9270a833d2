"""What /proc says about a process: its parent, group, session and start time.

The launcher kills a local agent's rank groups itself when the agent is gone, but
only groups it can prove that agent started: a pid the agent reported is accepted
when /proc names the agent as its parent, and is killed later only while it is
still the same process (same start time: a recycled pid is someone else's) and
still leads its own group.
"""

from __future__ import annotations

import contextlib
import os
import signal
from dataclasses import dataclass


@dataclass(frozen=True)
class ProcInfo:
    pid: int
    ppid: int
    pgid: int
    sid: int
    start: int
    """Start time in clock ticks since boot: with the pid, it names one process."""


def proc_info(pid: int) -> ProcInfo | None:
    """/proc/PID/stat of a live process (None when gone, a zombie, or unreadable)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    if fields[0] in ("Z", "X"):
        return None
    return ProcInfo(pid, int(fields[1]), int(fields[2]), int(fields[3]), int(fields[19]))


def child_groups(parent: int, pids: list[int]) -> list[ProcInfo]:
    """Those of ``pids`` that are children of ``parent`` and lead their own group."""
    found = []
    for pid in pids:
        info = proc_info(pid)
        if info is not None and info.ppid == parent and info.pgid == pid:
            found.append(info)
    return found


def kill_group(info: ProcInfo, signum: int = signal.SIGKILL) -> bool:
    """Signal the group ``info`` leads if that process is still the one recorded; whether it was sent."""
    now = proc_info(info.pid)
    if now is None or now.start != info.start or now.pgid != info.pid:
        return False
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(info.pid, signum)
        return True
    return False
