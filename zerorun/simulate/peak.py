"""This process's physical memory per phase: the kernel's resident-set high-water mark (Linux).

Writing ``5`` to ``/proc/self/clear_refs`` resets ``VmHWM`` to the current resident set,
so the ``VmHWM`` read at the end of a phase is the phase's own peak: memory the
allocator really touched, whatever the engine's bookkeeping believes it holds.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

from zerorun.engine.physical_memory import host_bytes, reset_host_peak, return_freed_memory

__all__ = ["Peak", "measured", "return_freed_memory"]

@dataclass
class Peak:
    """Resident bytes when a phase began and at its highest (None: not measurable here)."""

    start: int | None = None
    peak: int | None = None

    @property
    def rise(self) -> int | None:
        return None if self.start is None or self.peak is None else self.peak - self.start


@contextlib.contextmanager
def measured(enabled: bool = True) -> Iterator[Peak]:
    """Measure the ``with`` body's resident peak into the yielded :class:`Peak` (left empty when disabled)."""
    reading = Peak()
    if not enabled or not reset_host_peak():
        yield reading
        return
    reading.start = host_bytes("VmRSS")
    try:
        yield reading
    finally:
        reading.peak = host_bytes("VmHWM")
