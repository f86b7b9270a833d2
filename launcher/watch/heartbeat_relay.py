"""The agent's end of each rank's heartbeat: a pipe and a stack file per rank, the beats read,
checked and relayed to the launcher as ``heartbeat`` events, stacks dumped on request.

The pipe's write end reaches the rank as an inherited descriptor (``ZERORUN_HEARTBEAT_FD``),
the stack file (created here, owner-only, in a private folder) as another
(``ZERORUN_STACKS_FD``); see :mod:`zerorun.heartbeat.channel` for the rank's side. The rank a
beat belongs to is the pipe it came on, never a field of the beat, and every field is
checked for type and size before it goes on (a beat that fails is dropped): what a rank
prints cannot pose as a heartbeat, and a rank's own heartbeat cannot pose as another's.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from zerorun.heartbeat.channel import FD_ENV, MAX_BEAT, MAX_STEPS_PER_BEAT, STACK_SIGNAL, STACKS_FD_ENV

MAX_STACK_LINES = 400
STACK_WAIT_S = 2.0


def _num(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**62


def _short(v: Any, n: int = 64) -> bool:
    return isinstance(v, str) and len(v) <= n


def _record(v: Any) -> bool:
    return v is None or (isinstance(v, list) and len(v) == 4 and _int(v[0]) and _short(v[1]) and _int(v[2])
                         and _short(v[3]))


_CHECKS: dict[str, Callable[[Any], bool]] = {
    "v": _int, "t": _num, "phase": lambda v: _short(v, 40), "phase_s": _num, "step": _int, "micro": _int,
    "seq": _int, "issued": _record, "completed": _record, "label": lambda v: v is None or _short(v, 128),
    "wait_s": _num, "marks": _int, "io": _int, "stacks": _short,
    "samples_per_step": lambda v: v is None or _int(v), "tokens_per_sample": lambda v: v is None or _int(v),
    "steps": lambda v: isinstance(v, list) and len(v) <= MAX_STEPS_PER_BEAT and all(
        isinstance(s, list) and len(s) == 3 and _int(s[0]) and _num(s[1]) and _num(s[2]) for s in v),
    "mem": lambda v: isinstance(v, dict) and len(v) <= 8 and all(_short(k, 32) and _int(x) for k, x in v.items()),
    "user": lambda v: isinstance(v, dict) and len(v) <= 8 and all(
        _short(k, 32) and (_num(x) or _short(x)) for k, x in v.items()),
    "order": lambda v: isinstance(v, dict) and set(v) <= {"ring", "marks"} and _ints(v.get("ring"), 4, 64)
    and _ints(v.get("marks"), 2, 8),
}


def _ints(v: Any, width: int, most: int) -> bool:
    """A list of at most ``most`` lists of ``width`` non-negative ints (the order check's records)."""
    return isinstance(v, list) and len(v) <= most and all(
        isinstance(r, list) and len(r) == width and all(_int(x) for x in r) for r in v)


def checked_beat(line: bytes) -> dict[str, Any] | None:
    """The beat in ``line`` with its known, well-formed fields only; None if it is no beat at all."""
    if len(line) > MAX_BEAT:
        return None
    try:
        data = json.loads(line)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(data, dict) or data.get("v") != 1:
        return None
    return {k: v for k, v in data.items() if k in _CHECKS and _CHECKS[k](v)}


class RankChannel:
    """One rank's heartbeat pipe and stack file, on the agent."""

    def __init__(self, rank: int, folder: Path) -> None:
        self.rank = rank
        self.read_fd, self.write_fd = os.pipe()
        os.set_inheritable(self.read_fd, False)
        self.stacks_path = folder / f"stacks-rank{rank}.txt"
        self.stacks_fd = os.open(self.stacks_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o600)
        self.can_dump = False
        """Set once the rank said it answers the stack signal (only then is it sent)."""

    def env(self) -> dict[str, str]:
        return {FD_ENV: str(self.write_fd), STACKS_FD_ENV: str(self.stacks_fd)}

    def fds(self) -> tuple[int, int]:
        return self.write_fd, self.stacks_fd

    def spawned(self) -> None:
        """The rank holds its ends now: close ours, so the pipe ends when the rank does."""
        for fd in (self.write_fd, self.stacks_fd):
            with contextlib.suppress(OSError):
                os.close(fd)

    def read(self, relay: Callable[[dict[str, Any]], None]) -> None:
        """Relay every beat until the rank closes the pipe (it exited)."""
        with os.fdopen(self.read_fd, "rb") as stream:
            for line in stream:
                beat = checked_beat(line)
                if beat:
                    self.can_dump = self.can_dump or beat.get("stacks") == "signal"
                    relay(beat)

    def dump_stacks(self, pid: int) -> list[str] | None:
        """Every thread's Python stack, from faulthandler in the rank; None if it cannot answer."""
        if not self.can_dump:
            return None
        before = self.stacks_path.stat().st_size
        try:
            os.kill(pid, STACK_SIGNAL)
        except (ProcessLookupError, PermissionError):
            return None
        deadline, size = time.monotonic() + STACK_WAIT_S, before
        while time.monotonic() < deadline:  # wait for the dump to start, then to settle
            time.sleep(0.1)
            now = self.stacks_path.stat().st_size
            if now > before and now == size:
                break
            size = now
        with open(self.stacks_path, "rb") as fh:
            fh.seek(before)
            text = fh.read(256 * 1024).decode(errors="replace")
        return [line[:1000] for line in text.splitlines()[:MAX_STACK_LINES]] or None


def private_folder() -> Path:
    """A folder only this user can enter, for the node's stack files (removed with the agent)."""
    return Path(tempfile.mkdtemp(prefix="zerorun-agent-"))


def remove_folder(folder: Path) -> None:
    for path in folder.glob("stacks-rank*.txt"):
        path.unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        folder.rmdir()


class HeartbeatRelay:
    """Every rank channel of one agent; ``emit(kind, **fields)`` sends an event to the launcher."""

    def __init__(self, node_rank: int, emit: Callable[..., None]) -> None:
        self.node_rank = node_rank
        self.emit = emit
        self.folder = private_folder()
        self.channels: dict[int, RankChannel] = {}
        self.pids: dict[int, int] = {}

    def prepare(self, rank: int) -> tuple[dict[str, str], tuple[int, int]]:
        """The env and the descriptors rank ``rank`` is started with."""
        ch = self.channels[rank] = RankChannel(rank, self.folder)
        return ch.env(), ch.fds()

    def spawned(self, rank: int, pid: int) -> None:
        ch = self.channels[rank]
        ch.spawned()
        self.pids[rank] = pid
        relay = lambda beat: self.emit("heartbeat", node_rank=self.node_rank, rank=rank, beat=beat)  # noqa: E731
        threading.Thread(target=ch.read, args=(relay,), name=f"heartbeat-{rank}", daemon=True).start()

    def dump_all(self) -> None:
        """Ask every rank for its stacks (in parallel, off the agent's loop); each answer is a ``stacks`` event."""
        def one(rank: int) -> None:
            lines = self.channels[rank].dump_stacks(self.pids[rank])
            self.emit("stacks", node_rank=self.node_rank, rank=rank, lines=lines or [])

        for rank in self.pids:
            threading.Thread(target=one, args=(rank,), daemon=True).start()

    def exited(self, rank: int, exit_code: int) -> None:
        self.pids.pop(rank, None)
        self.emit("rank_exited", node_rank=self.node_rank, rank=rank, exit_code=exit_code)

    def close(self) -> None:
        remove_folder(self.folder)
