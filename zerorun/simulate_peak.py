"""This process's physical memory per phase: the kernel's resident-set high-water mark (Linux).

Writing ``5`` to ``/proc/self/clear_refs`` resets ``VmHWM`` to the current resident set,
so the ``VmHWM`` read at the end of a phase is the phase's own peak: memory the
allocator really touched, whatever the engine's bookkeeping believes it holds.
"""

from __future__ import annotations

import contextlib
import ctypes
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")


@dataclass
class Peak:
    """Resident bytes when a phase began and at its highest (None: not measurable here)."""

    start: int | None = None
    peak: int | None = None

    @property
    def rise(self) -> int | None:
        return None if self.start is None or self.peak is None else self.peak - self.start


def _status_bytes(key: str) -> int | None:
    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024  # kB
    except OSError:
        return None
    return None


_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters


def return_freed_memory() -> bool:
    """Make glibc hand freed buffers back to the kernel at once (False where it is not glibc).

    By default glibc raises its mmap threshold after the first large free, so later
    buffers of up to 32 MiB come from its heap and stay resident after they are freed:
    the high-water mark would then measure the allocator's retention as much as what the
    engine holds. A fixed threshold keeps every large buffer an mmap of its own, returned
    when freed. It costs a page fault per page of every new buffer (about 2x the step time
    on the benchmark MLP), which is why only the simulation's CPU mode sets it.
    """
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, 128 * 1024)) and bool(mallopt(_M_TRIM_THRESHOLD, 128 * 1024))


def reset_high_water() -> bool:
    """Start a new high-water mark at the current resident set; False where the kernel does not allow it."""
    try:
        _CLEAR_REFS.write_text("5")
    except OSError:
        return False
    return True


@contextlib.contextmanager
def measured(enabled: bool = True) -> Iterator[Peak]:
    """Measure the ``with`` body's resident peak into the yielded :class:`Peak` (left empty when disabled)."""
    reading = Peak()
    if not enabled or not reset_high_water():
        yield reading
        return
    reading.start = _status_bytes("VmRSS")
    try:
        yield reading
    finally:
        reading.peak = _status_bytes("VmHWM")
