"""Stage 3's released gathered buffers on the host, kept for the next gather of the same size within a pass.

A released unit frees its full buffer *in place* (:mod:`zerorun.engine.mechanism.partition`):
its storage is resized to 0 and the next gather allocates again. On the host that churn goes
through glibc, and its heap fragments: the small tensors a forward saves for backward are cut
out of the holes released units leave, so the next unit no longer fits there and the heap
grows, about one unit per block (the memory benchmark's tight window at 24 blocks of 4 MiB
units: a peak 55 MiB above the same run with every large buffer mapped on its own).

The pool keeps the bytes instead. A release moves the storage's bytes into an idle holder
(``UntypedStorage._swap_data_ptr_``: the bucket's storage is left empty, exactly as a resize
to 0 leaves it, so autograd's saved views stay what they were); the next gather of that size
moves them back, with no allocation and no page fault. Only buffers released while a pass
runs are kept, and only for the next :data:`HORIZON` gathers, so the pool holds about what the
window held at once; at the end of each pass (:meth:`drain`) the idle bytes go back to the allocator, so the optimizer step and the
code between steps see the heap as before. Stage 3's gradient staging buffers, of the largest unit's
size, are filled from and kept in the same pool (:class:`~zerorun.engine.mechanism.sharded_grads.
UnitGradSync`): a released unit's bytes stage the next gradients, a reduced staging buffer's serve
the next gather. On a GPU the caching allocator pools already (and
orders reuse by stream): the pool is for host buffers only. ``ZERORUN_POOL_GATHERED=0`` turns
it off.
"""

from __future__ import annotations

import os

import torch

from zerorun import torch_compat
from zerorun.engine import physical_memory

Key = tuple[str, int]

HORIZON = 4
"""Gathers an idle buffer waits for one of its size before it is handed back. A block's units recur
within a gather or two in either pass; a unit gathered once in a pass (an embedding, the head) would
otherwise idle beside the window until the pass ends."""


class BufferPool:
    def __init__(self, horizon: int = HORIZON) -> None:
        self.horizon = horizon
        # byte tensors, not bare storages: the engine's accounts (zerorun.simulate) see what idles here;
        # each with the gather count when it was kept
        self._idle: dict[Key, list[tuple[torch.Tensor, int]]] = {}
        self._gathers = 0
        self.idle_bytes = 0
        self.reused = 0  # gathers filled from an idle buffer
        self.allocated = 0  # gathers that found none of their size

    @staticmethod
    def for_devices(devices: set[torch.device]) -> BufferPool | None:
        """A pool for buffers on ``devices``, or None: a device other than the host, a torch without the
        storage swap, an allocator that returns freed buffers at once (nothing to avoid; idle buffers
        would only add), or ``ZERORUN_POOL_GATHERED=0``."""
        if os.environ.get("ZERORUN_POOL_GATHERED", "1") == "0" or not torch_compat.can_swap_storage_bytes():
            return None
        if physical_memory.frees_return_to_kernel():
            return None
        return BufferPool() if devices and all(d.type == "cpu" for d in devices) else None

    def fill(self, storage: torch.UntypedStorage, nbytes: int) -> None:
        """Give the empty ``storage`` ``nbytes``: an idle buffer of that size when one is kept, else new."""
        self._gathers += 1
        idle = self._idle.get((str(storage.device), nbytes))
        if idle:
            torch_compat.swap_storage_bytes(storage, idle.pop()[0].untyped_storage())
            self.idle_bytes -= nbytes
            self.reused += 1
        self._expire()  # before any allocation: what waited too long makes room
        if storage.nbytes() != nbytes:
            storage.resize_(nbytes)
            self.allocated += 1

    def keep(self, storage: torch.UntypedStorage) -> None:
        """Take ``storage``'s bytes for a later :meth:`fill`, leaving it empty."""
        nbytes = storage.nbytes()
        if nbytes == 0:
            return
        holder = torch.empty(0, dtype=torch.uint8, device=storage.device)
        torch_compat.swap_storage_bytes(holder.untyped_storage(), storage)
        self._idle.setdefault((str(storage.device), nbytes), []).append((holder, self._gathers))
        self.idle_bytes += nbytes

    def _expire(self) -> None:
        for key, idle in self._idle.items():
            stale = [e for e in idle if self._gathers - e[1] > self.horizon]
            if stale:
                idle[:] = [e for e in idle if self._gathers - e[1] <= self.horizon]
                self.idle_bytes -= key[1] * len(stale)

    def drain(self) -> None:
        """Hand every idle buffer back to the allocator."""
        self._idle.clear()
        self.idle_bytes = 0
