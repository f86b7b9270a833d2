"""Rank output on an agent: ``[host:rank]`` prefixes, colours, the console filter,
per-rank log files (teed), and the last stderr lines kept for the failure report."""

from __future__ import annotations

import threading
from collections import deque
from pathlib import Path
from typing import BinaryIO

_COLOURS = (36, 32, 34, 35, 96, 92, 94, 95)
"""Cyan, green, blue, magenta and their bright kin: no red or yellow, which read as errors and warnings."""
TAIL_LINES = 20


class OutputSink:
    """Thread-safe writer shared by every rank's reader threads on one agent."""

    def __init__(
        self,
        host: str,
        stdout: BinaryIO,
        stderr: BinaryIO,
        *,
        color: bool = False,
        console_ranks: tuple[int, ...] | None = None,
        log_dir: str | None = None,
    ) -> None:
        self._host = host
        self._out = stdout
        self._err = stderr
        self._color = color
        self._console = None if console_ranks is None else frozenset(console_ranks)
        self._log_dir = Path(log_dir) if log_dir else None
        self._logs: dict[int, BinaryIO] = {}
        self._tails: dict[int, deque[str]] = {}
        self._lock = threading.Lock()
        self.broken = threading.Event()
        """Set when the console (the launcher's pipe or ssh channel) is gone."""
        if self._log_dir is not None:
            self._log_dir.mkdir(parents=True, exist_ok=True)

    def log_path(self, rank: int) -> str | None:
        return None if self._log_dir is None else str(self._log_dir / f"rank{rank}.log")

    def prefix(self, rank: int) -> bytes:
        text = f"[{self._host}:{rank}]"
        if self._color:
            text = f"\x1b[{_COLOURS[rank % len(_COLOURS)]}m{text}\x1b[0m"
        return (text + " ").encode()

    def line(self, rank: int, data: bytes, is_stderr: bool) -> None:
        """One line of a rank's output (``data`` ends with a newline unless it is the last)."""
        if not data.endswith(b"\n"):
            data += b"\n"
        with self._lock:
            if is_stderr:
                self._tails.setdefault(rank, deque(maxlen=TAIL_LINES)).append(data.decode(errors="replace").rstrip("\n"))
            log = self._log_file(rank)
            if log is not None:
                log.write(data)
                log.flush()
            if self._console is None or rank in self._console:
                self._write(self._err if is_stderr else self._out, self.prefix(rank) + data)

    def raw(self, text: str, is_stderr: bool = False) -> None:
        """A line of the agent's own (an event or a notice)."""
        with self._lock:
            self._write(self._err if is_stderr else self._out, text.encode())

    def tail(self, rank: int) -> list[str]:
        with self._lock:
            return list(self._tails.get(rank, ()))

    def close(self) -> None:
        with self._lock:
            for log in self._logs.values():
                log.close()
            self._logs.clear()

    def _log_file(self, rank: int) -> BinaryIO | None:
        if self._log_dir is None:
            return None
        if rank not in self._logs:
            self._logs[rank] = open(self._log_dir / f"rank{rank}.log", "ab")  # noqa: SIM115 - closed in close()
        return self._logs[rank]

    def _write(self, stream: BinaryIO, data: bytes) -> None:
        if self.broken.is_set():
            return
        try:
            stream.write(data)
            stream.flush()
        except (BrokenPipeError, OSError, ValueError):
            self.broken.set()
