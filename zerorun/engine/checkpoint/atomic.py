"""Durable, all-or-nothing file writes: write a temporary name, fsync, rename, fsync the directory.

A reader never sees a half-written file under its final name: ``rename`` within one
directory is atomic on POSIX file systems, and the fsyncs make the data and the new
directory entry survive a power cut, not only a killed process.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

import torch


def fsync_dir(path: Path) -> None:
    """Make the directory entries of ``path`` (created, renamed files) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_with(path: Path, write: Callable[[BinaryIO], None]) -> int:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
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


def write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically and durably."""
    _write_with(path, lambda f: f.write(data))


def write_text(path: Path, text: str) -> None:
    write_bytes(path, text.encode())


def torch_save(obj: object, path: Path) -> int:
    """``torch.save`` ``obj`` to ``path`` atomically; returns the bytes written."""
    return _write_with(path, lambda f: torch.save(obj, f))


def rename_dir(src: Path, dst: Path) -> None:
    """Rename a directory atomically and make the change durable."""
    os.rename(src, dst)
    fsync_dir(dst.parent)
