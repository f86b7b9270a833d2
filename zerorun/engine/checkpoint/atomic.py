"""Durable, all-or-nothing checkpoint writes: ``zerorun.atomic_file`` plus ``torch.save`` and folder renames.

A reader never sees a half-written file under its final name: each file is written to a
fresh ``mkstemp`` name in its own folder (never a guessable name a symlink could sit on),
fsynced and renamed; the fsyncs make the data and the new directory entry survive a power
cut, not only a killed process. A failed write leaves no temporary file behind.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from zerorun.atomic_file import fsync_dir, write_bytes, write_text, write_with

__all__ = ["fsync_dir", "rename_dir", "torch_save", "write_bytes", "write_text"]


def torch_save(obj: object, path: Path) -> int:
    """``torch.save`` ``obj`` to ``path`` atomically; returns the bytes written."""
    return write_with(path, lambda f: torch.save(obj, f))


def rename_dir(src: Path, dst: Path) -> None:
    """Rename a directory atomically and make the change durable."""
    os.rename(src, dst)
    fsync_dir(dst.parent)
