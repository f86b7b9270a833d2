"""All-or-nothing file writes: a fresh temporary file beside the target, fsync, rename, fsync the folder.

The temporary file comes from ``mkstemp`` in the target's own folder (``O_CREAT|O_EXCL``,
an unpredictable name): a name a stranger guessed and planted as a symlink is never
opened, so the write cannot land in their file, and ``rename`` within one folder is
atomic, so a reader sees the old file or the whole new one. The file takes the mode the
user's umask gives (``mkstemp``'s 0600 would hide a checkpoint from the user's group).
A failed write (a full disk) removes its temporary file. Needs nothing but the standard library.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO


def fsync_dir(path: Path) -> None:
    """Make the directory entries of ``path`` (created, renamed files) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def umask() -> int:
    """The process's umask, read without changing it where Linux says it (``os.umask`` sets it meanwhile)."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o077)
    os.umask(mask)
    return mask


def write_with(path: Path, write: Callable[[BinaryIO], object], mode: int | None = None) -> int:
    """Write ``path`` through ``write(file)`` atomically and durably; returns the bytes written.

    ``mode`` defaults to what ``open()`` would give (0666 less the umask).
    """
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    tmp = Path(name)
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), (0o666 & ~umask()) if mode is None else mode)
            write(f)
            f.flush()
            os.fsync(f.fileno())
            size = f.tell()
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)
    return size


def write_bytes(path: Path, data: bytes, mode: int | None = None) -> None:
    """Write ``data`` to ``path`` atomically and durably."""
    write_with(path, lambda f: f.write(data), mode)


def write_text(path: Path, text: str, mode: int | None = None) -> None:
    write_bytes(path, text.encode(), mode)
