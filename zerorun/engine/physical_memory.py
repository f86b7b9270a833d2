"""Physical memory of this process, as the kernel and the CUDA allocator count it.

The engine's own bookkeeping (``figures.memory_breakdown``) counts the bytes it means
to hold; these figures count what the process really holds, so a buffer that autograd
still references after the engine released it shows here and not there.

Host (Linux): ``host_rss`` is the resident set now (``VmRSS``), ``host_peak_rss`` the
kernel's high-water mark (``VmHWM``) since the last :func:`reset_peak` (else since the
process started), and ``host_baseline_rss`` the resident set at ``import zerorun`` when
torch was already loaded (else when the engine first loaded): torch loaded, nothing of
the script's model yet when it imports zerorun before building the model, plus the libraries
torch.optim loads lazily when the engine loads them (:func:`load_optimizer_runtime`). All
three are absolute: what a step holds is ``host_peak_rss`` less a baseline the reader chooses
(this one, or its own taken right after ``import torch``).

CUDA: ``device_peak_allocated`` and ``device_peak_reserved`` are
``torch.cuda.max_memory_allocated`` / ``max_memory_reserved`` since the last reset.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import gc
import importlib
import os
import sys
from collections.abc import Callable
from pathlib import Path

import torch

from zerorun import torch_compat

HOST_KEYS = ("host_rss", "host_peak_rss", "host_baseline_rss")
DEVICE_KEYS = ("device_peak_allocated", "device_peak_reserved")
PHYSICAL_KEYS = HOST_KEYS + DEVICE_KEYS

_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")


def _host_status() -> dict[str, int] | None:
    """``{"VmRSS": bytes, "VmHWM": bytes}`` of this process; None where /proc has no status (not Linux)."""
    try:
        lines = _STATUS.read_text().splitlines()
    except OSError:
        return None
    out = {}
    for line in lines:
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0]) * 1024  # the kernel reports kB
    return out if len(out) == 2 else None


_BASELINE = (_host_status() or {}).get("VmRSS")
_LAZY_RUNTIME = torch_compat.compiler_runtime_module()  # torch._dynamo, what the first torch.optim optimizer imports (~72 MiB resident, 1.2 s)


def load_optimizer_runtime() -> int:
    """Import what any torch.optim optimizer (and the engine's own modules) import lazily, now, and
    count its resident growth in ``host_baseline_rss``: the same libraries for every run and every
    stage, no part of a model's state (``bench/memory.py`` leaves them out of its peaks the same
    way). ``zerorun`` calls it when a script first reaches for the engine (``zerorun.initialize``,
    ``zerorun.zero``, ...); an optimizer the script built before that has loaded them already,
    and they then count in the step's peak. Returns the bytes added to the baseline."""
    global _BASELINE
    if _LAZY_RUNTIME in sys.modules:
        return 0
    before = (_host_status() or {}).get("VmRSS")
    importlib.import_module(_LAZY_RUNTIME)
    after = (_host_status() or {}).get("VmRSS")
    if _BASELINE is None or before is None or after is None:
        return 0
    grown = max(0, after - before)
    _BASELINE += grown
    return grown


def _libc() -> ctypes.CDLL | None:
    with contextlib.suppress(OSError, TypeError):
        return ctypes.CDLL(ctypes.util.find_library("c"))
    return None


_LIBC = _libc()
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters


def trim_heap() -> None:
    """Give glibc's free lists back to the kernel, so the resident set is what is still in use."""
    with contextlib.suppress(AttributeError):
        if _LIBC is not None:
            _LIBC.malloc_trim(0)


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]


def _mallinfo2() -> Callable[[], _Mallinfo2] | None:
    fn = getattr(_LIBC, "mallinfo2", None)  # glibc >= 2.33
    if fn is not None:
        fn.restype = _Mallinfo2
    return fn


_MALLINFO2 = _mallinfo2()

TRIM_ABOVE = 32 * 2**20
"""Free heap, over every arena, below which :func:`trim_heap_if_large` leaves it: what a trim would hand
back then costs more (the next step faults the pages in again, and the trim walks every arena) than it
saves; glibc's own trim threshold moves up to twice a 32 MiB buffer anyway."""

TRIM_SHARE = 0.25
"""...nor while the free heap is under this share of the resident set. A trim every step cost the CPU
benchmark's stage 3 a fifth of its step time (0.381 against 0.304 s; stage 2 0.301 against 0.270) and
slowed every other model of the process too (their next step faults the pages in again), for at most 3%
of the peak once Adam's state stopped being made inside the first step (BENCHMARKS.md, issue 48): the
trim is for retention that grows, not for a step's usual churn."""


def free_heap_bytes() -> int | None:
    """Bytes glibc holds free in all its arenas (``mallinfo2().fordblks``); None where it cannot say."""
    return None if _MALLINFO2 is None else int(_MALLINFO2().fordblks)


def trim_heap_if_large(above: int = TRIM_ABOVE, share: float = TRIM_SHARE) -> bool:
    """:func:`trim_heap` when glibc holds more than ``above`` bytes free and more than ``share`` of the
    resident set (always where it cannot say how much is free)."""
    free = free_heap_bytes()
    # the resident set is read (from /proc) only when the heap holds over ``above``: most steps read nothing
    if free is not None and (free <= above or free <= share * (host_bytes("VmRSS") or 0)):
        return False
    trim_heap()
    return True


def return_freed_memory() -> bool:
    """Make glibc hand freed buffers back to the kernel at once (False where it is not glibc).

    By default glibc raises its mmap threshold after the first large free, so later
    buffers of up to 32 MiB come from its heap and stay resident after they are freed:
    a high-water mark then measures the allocator's retention as much as what the
    engine holds. A fixed threshold keeps every large buffer an mmap of its own, returned
    when freed, at the cost of a page fault per page of every new buffer; the engine does
    not set it (the simulation's CPU mode and ``bench/memory.py --returning-allocator`` do).
    """
    try:
        mallopt = _LIBC.mallopt  # type: ignore[union-attr]
    except AttributeError:
        return False
    global _RETURNING
    _RETURNING = bool(mallopt(_M_MMAP_THRESHOLD, 128 * 1024)) and bool(mallopt(_M_TRIM_THRESHOLD, 128 * 1024))
    return _RETURNING


_RETURNING = False


def frees_return_to_kernel() -> bool:
    """Whether glibc hands a freed large buffer straight back (:func:`return_freed_memory` ran, or a fixed
    threshold came through the environment): then no freed buffer lingers in its heap."""
    return _RETURNING or any(k in os.environ for k in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_"))


def host_bytes(key: str) -> int | None:
    """``VmRSS`` or ``VmHWM`` of this process in bytes (None where /proc has no status)."""
    status = _host_status()
    return None if status is None else status[key]


def reset_host_peak() -> bool:
    """The host high-water mark drops to the resident set now (False: no writable clear_refs)."""
    try:
        _CLEAR_REFS.write_text("5")  # 5: reset the peak RSS to the current RSS (proc(5))
    except OSError:
        return False
    return True


def reset_peak(device: torch.device) -> bool:
    """Start a new peak window: the host high-water mark drops to the resident set now (after
    freeing garbage and trimming the heap) and CUDA's peak counters restart.

    Returns False where the host peak could not be reset (no writable ``/proc/self/clear_refs``):
    ``host_peak_rss`` then still counts from the start of the process.
    """
    gc.collect()
    trim_heap()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    return reset_host_peak()


def physical_figures(device: torch.device) -> dict[str, int]:
    """The physical keys this platform knows (host keys on Linux, device keys on CUDA), in bytes."""
    out: dict[str, int] = {}
    status = _host_status()
    if status is not None:
        out.update(host_rss=status["VmRSS"], host_peak_rss=status["VmHWM"], host_baseline_rss=_BASELINE or 0)
    if device.type == "cuda":
        out.update(device_peak_allocated=int(torch.cuda.max_memory_allocated(device)),
                   device_peak_reserved=int(torch.cuda.max_memory_reserved(device)))
    return out

