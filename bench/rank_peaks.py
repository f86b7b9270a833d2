"""Peak resident memory (the kernel's ``VmHWM``) of each rank of a launched job, read from /proc while it runs.

Any launcher works (DeepSpeed's, zerorun's, torchrun): a thread walks the launcher's process
tree a few times a second and, for every process running the script with a ``RANK`` in the
environment it started with, keeps the high-water mark the kernel reports for it. Launchers
start without a ``RANK`` (they set it for their children only); a process a rank forks
(a data-loader worker) inherits both and is told apart by depth: the rank is the shallowest
process of its rank. Compilers and other programs a rank runs do not run the script.
``VmHWM`` only grows, so the last reading before a rank exits is its peak (a growth in the
last poll interval before exit would be missed).
"""

from __future__ import annotations

import threading
from pathlib import Path

PROC = Path("/proc")


def _parents() -> dict[int, int]:
    """pid -> ppid of every process now (the field after the command name in /proc/PID/stat)."""
    out = {}
    for stat in PROC.glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:  # exited meanwhile
            continue
        out[int(stat.parent.name)] = int(text[text.rindex(")") + 2:].split()[1])
    return out


def _descendants(root: int) -> dict[int, int]:
    """pid -> depth below ``root`` of every live descendant."""
    children: dict[int, list[int]] = {}
    for pid, ppid in _parents().items():
        children.setdefault(ppid, []).append(pid)
    out, frontier, depth = {}, [root], 0
    while frontier:
        depth += 1
        frontier = [c for p in frontier for c in children.get(p, [])]
        out.update(dict.fromkeys(frontier, depth))
    return out


def _rank(pid: int, script: str) -> int | None:
    """The RANK of a process running ``script``; None for any other process."""
    try:
        argv = (PROC / str(pid) / "cmdline").read_bytes().split(b"\0")
        environ = (PROC / str(pid) / "environ").read_bytes().split(b"\0")
    except OSError:
        return None
    if not any(a.decode(errors="replace").endswith(script) for a in argv):
        return None
    for entry in environ:
        if entry.startswith(b"RANK="):
            return int(entry[5:])
    return None


def _hwm_bytes(pid: int) -> int | None:
    try:
        for line in (PROC / str(pid) / "status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024  # the kernel reports kB
    except OSError:
        pass
    return None


class RankPeaks(threading.Thread):
    """Polls the tree under ``root`` until :meth:`stop`; :meth:`peaks` gives rank -> peak bytes."""

    def __init__(self, root: int, script: str, interval: float = 0.2) -> None:
        super().__init__(daemon=True)
        self.root, self.script, self.interval = root, script, interval
        self._done = threading.Event()
        self._seen: dict[int, tuple[int, int, int]] = {}  # pid -> (rank, depth, peak bytes)
        self._skip: set[int] = set()  # pids that run something else

    def run(self) -> None:
        while not self._done.wait(self.interval):
            self._poll()

    def _poll(self) -> None:
        for pid, depth in _descendants(self.root).items():
            if pid in self._skip:
                continue
            rank = self._seen[pid][0] if pid in self._seen else _rank(pid, self.script)
            if rank is None:
                self._skip.add(pid)
                continue
            hwm = _hwm_bytes(pid)
            if hwm is not None:
                self._seen[pid] = (rank, depth, max(hwm, self._seen.get(pid, (0, 0, 0))[2]))

    def stop(self) -> None:
        self._done.set()
        self.join()

    def peaks(self) -> dict[int, int]:
        """rank -> the peak of the shallowest process of that rank (the rank itself, not a fork of it)."""
        best: dict[int, tuple[int, int]] = {}
        for rank, depth, peak in self._seen.values():
            if rank not in best or depth < best[rank][0]:
                best[rank] = (depth, peak)
        return {rank: peak for rank, (_, peak) in sorted(best.items())}
