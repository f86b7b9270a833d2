"""The host step's arrays in 2 MiB pages (transparent huge pages) where the kernel gives them only on request.

The host step streams four arrays per parameter (master, gradient, the two moments: 28 bytes
read or written per fp32 parameter), and with 4 KiB pages each stream crosses a page, a TLB
miss, every 1024 elements. Linux backs memory with 2 MiB pages when the program asks before it
first touches it (``madvise(MADV_HUGEPAGE)``) if ``/sys/kernel/mm/transparent_hugepage/enabled``
is ``madvise`` (Ubuntu's default); ``always`` does it unasked, ``never`` not at all. Measured with
torch's fused AdamW, one thread, 25.5M parameters on this project's machine: 0.75 CPU ns per
parameter in 4 KiB pages, 0.64 in 2 MiB pages (bench/offload.py --kernels, BENCHMARKS.md).

So, under ``madvise`` only, the host masters are copied at set-up, and each optimizer state
tensor once after the step that created it (the optimizer allocates and fills it in one go),
into fresh memory advised for huge pages: one copy each, the values unchanged. The fresh memory
is an anonymous mapping of its own, 2 MiB-aligned inside: memory from the allocator may be
reused pages already faulted in at 4 KiB, which the advice does not change. Pinned memory
(CUDA's host allocator, already locked in place), tensors under :data:`MIN_BYTES` and systems
other than Linux are left as they are.
"""

from __future__ import annotations

import functools
import mmap
import sys
from pathlib import Path

import torch

THP_MODE = Path("/sys/kernel/mm/transparent_hugepage/enabled")
PAGE = 2 << 20
MIN_BYTES = 2 * PAGE  # below this, at most one whole 2 MiB page inside the tensor
_MARK = "_zerorun_huge"  # set on a tensor copied here: it is not copied again


@functools.cache
def wanted() -> bool:
    """True where :func:`huge_copy` moves anything: Linux, with huge pages given on request only."""
    if sys.platform != "linux" or not hasattr(mmap, "MADV_HUGEPAGE"):
        return False
    try:
        return "[madvise]" in THP_MODE.read_text()
    except OSError:
        return False


def aligned_span(address: int, nbytes: int) -> tuple[int, int]:
    """``(start, length)`` of the whole 2 MiB pages inside ``[address, address + nbytes)`` (length 0: none)."""
    start = -(-address // PAGE) * PAGE
    end = (address + nbytes) // PAGE * PAGE
    return start, max(0, end - start)


def _fresh(nbytes: int) -> torch.Tensor:
    """``nbytes`` of untouched memory starting on a 2 MiB boundary, advised for huge pages (uint8).

    The tensor keeps the mapping alive (``torch.frombuffer`` holds the buffer); the first write
    faults the pages in, 2 MiB at a time where the kernel has them, 4 KiB otherwise."""
    # private (Python's default is shared: shmem, whose huge pages are a setting of their own)
    region = mmap.mmap(-1, nbytes + PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    raw = torch.frombuffer(region, dtype=torch.uint8)
    start, _ = aligned_span(raw.data_ptr(), 1)
    offset = start - raw.data_ptr()
    region.madvise(mmap.MADV_HUGEPAGE, offset, nbytes + PAGE - offset)
    return raw[offset:offset + nbytes]


def huge_copy(t: torch.Tensor) -> torch.Tensor:
    """``t``'s values in fresh host memory advised for huge pages, or ``t`` itself where that does not apply."""
    nbytes = t.numel() * t.element_size()
    if (not wanted() or getattr(t, _MARK, False) or t.device.type != "cpu" or nbytes < MIN_BYTES
            or not t.is_contiguous() or t.is_pinned()):
        return t
    out = _fresh(nbytes).view(t.dtype).view(t.shape)
    out.copy_(t)
    setattr(out, _MARK, True)
    return out


def settle_state(optimizer: torch.optim.Optimizer, masters: list[torch.Tensor]) -> None:
    """Each of ``masters``' optimizer state tensors in huge pages, copied once (after the step that made it)."""
    if not wanted():
        return
    for m in masters:
        state = optimizer.state.get(m)
        for key, value in (state or {}).items():
            if torch.is_tensor(value):
                state[key] = huge_copy(value)
