"""Host<->device copies of offload: pinned and non-blocking where CUDA is present, with their sync points.

The rules this module keeps in one place (every ``non_blocking`` copy of the engine is
issued here, :meth:`Transfers._issue`; tests/engine/offload/test_copy_checks.py holds that):

* host buffers are pinned only when the policy asks (``pin_memory``) and CUDA is present:
  pinning is what lets a copy to or from a GPU run asynchronously, and it needs CUDA;
* a device->host copy (:meth:`Transfers.down`) is issued ``non_blocking`` into pinned
  buffers, then waited for once, on an event recorded after the last copy on the current
  stream, before the CPU (the offloaded optimizer) reads any of them;
* any other copy between host and device through pinned memory (:meth:`Transfers.copy`)
  is ``non_blocking`` on the current stream: the kernels and collectives issued after it on
  that stream see the data (NCCL work waits on the current stream), so the device side
  needs no host sync; the host side is not to be read (device->host) or overwritten
  (host->device) by the CPU until the copy's fence (returned by ``copy``) or
  :meth:`Transfers.wait` has been waited for;
* a slot of the pinned ring (:meth:`Transfers.staged`) is overwritten only after the copy
  that read it last is waited for, on that copy's own fence;
* a reduced gradient chunk goes to its host sum off the compute stream
  (:meth:`Transfers.side_down`): on a side stream that first waits for the current stream
  (the reduction's result), so backward's kernels keep running while it copies; its fence is
  recorded there, the CPU waits for it before reading the host side, and the compute stream
  waits for it (:meth:`Transfers.order_after`, no host sync) before it writes the device
  buffer the copy read. The source is marked used on the side stream (``record_stream``), so
  freeing it on the compute stream does not hand its memory out before the copy is done.

With a CPU compute device every copy is a same-device no-op and nothing is synchronised.
``cuda`` is a constructor argument so that the sync discipline is testable without a GPU;
:mod:`zerorun.engine.offload.copy_checks` is the stand-in that defers every queued copy
until its fence is waited for (``ZERORUN_CHECK_COPIES=deferred``).
"""

from __future__ import annotations

from types import ModuleType
from typing import Any, Protocol

import torch

HOST = torch.device("cpu")


class Fence(Protocol):
    """An event recorded on the current stream after a copy: waiting for it means the copy is done."""

    def synchronize(self) -> None: ...


class _Lent:
    """A ring slot handed out by :meth:`Transfers.staged` that no copy through :meth:`Transfers.copy` read yet."""

    def synchronize(self) -> None:  # pragma: no cover - never waited for as such (see _settle_slot)
        raise AssertionError("a lent slot has no fence")


LENT = _Lent()


class Transfers:
    def __init__(self, pin_memory: bool, cuda: ModuleType | Any = torch.cuda) -> None:
        self.cuda = cuda
        self.pins = bool(pin_memory) and bool(cuda.is_available())
        self._pending: Fence | None = None  # event after the last queued copy (see ``copy``)
        self.syncs = 0  # host waits, for tests and figures
        self._ring: list[torch.Tensor] = []  # pinned buffers of staged(), reused
        self._slot_fence: list[Fence | _Lent | None] = []  # per slot: the fence of the copy that read it last
        self._turn = 0
        self._side: Any = None  # the side stream of side_down (made on first use)

    # ---- seams (the only places that touch pinned memory, issue an asynchronous copy or ask where
    # a tensor is; the stand-in of copy_checks overrides them) -------------------------------------
    def _pin(self, t: torch.Tensor) -> torch.Tensor:
        return t.pin_memory()

    def _pinned_empty(self, shape: torch.Size, dtype: torch.dtype) -> torch.Tensor:
        return torch.empty(shape, dtype=dtype, device=HOST, pin_memory=True)

    def is_pinned(self, t: torch.Tensor) -> bool:
        return t.is_pinned()

    def on_host(self, t: torch.Tensor) -> bool:
        return t.device.type == "cpu"

    def _issue(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        """``dst.copy_(src)`` queued on the current stream (one side pinned host memory)."""
        dst.copy_(src, non_blocking=True)

    def _fence(self) -> Fence:
        event = self.cuda.Event()
        event.record()  # on the current stream, after everything issued on it so far
        return event

    def _side_issue(self, dst: torch.Tensor, src: torch.Tensor) -> Fence:
        """``dst.copy_(src)`` (device->pinned host) on the side stream, after the current stream's work so far."""
        if self._side is None:
            self._side = self.cuda.Stream()
        self._side.wait_stream(self.cuda.current_stream())
        with self.cuda.stream(self._side):
            dst.copy_(src, non_blocking=True)
            src.record_stream(self._side)
            event = self.cuda.Event()
            event.record()  # on the side stream
        return event

    def order_after(self, fence: Fence) -> None:
        """The current stream's later work waits for ``fence`` (a side copy's source is written next)."""
        self.cuda.current_stream().wait_event(fence)

    def _unconsumed_slot(self, index: int) -> None:
        """A slot is reused that staged() handed out but no copy through :meth:`copy` read: whatever read it
        was issued elsewhere, so nothing says it is done; wait for all the current stream holds."""
        self._fence().synchronize()
        self.syncs += 1

    # ---- host buffers -----------------------------------------------------------------------
    def pinned(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` (a host tensor) in pinned memory when the policy pins, else ``t`` itself."""
        return self._pin(t) if self.pins and not self.is_pinned(t) else t

    def host_empty(self, numel: int, dtype: torch.dtype) -> torch.Tensor:
        """A new 1-D host buffer, pinned when the policy pins (then copies to and from it are asynchronous)."""
        if self.pins:
            return self._pinned_empty(torch.Size([numel]), dtype)
        return torch.empty(numel, dtype=dtype, device=HOST)

    def staged(self, t: torch.Tensor, slots: int = 2) -> torch.Tensor:
        """``t`` (a host tensor) copied into one of a fixed ring of pinned buffers when pinning, else ``t``.

        For data read afresh every step (swap files): pinning each read would ask torch's
        caching host allocator for a new block every time, and it keeps every block it ever
        handed out (rounded up to a power of two), so pinned memory would grow with the
        swapped bytes. The ring holds ``slots`` buffers of the largest size asked for; a slot
        is overwritten only after the copy that read it (through :meth:`copy`) is done.
        """
        if not self.pins:
            return t
        nbytes = t.numel() * t.element_size()
        if len(self._ring) < slots:
            self._ring.append(self._pinned_empty(torch.Size([nbytes]), torch.uint8))
            self._slot_fence.append(None)
            self._turn = len(self._ring) - 1
        k = self._turn
        self._settle_slot(k)  # the slot's previous contents may still be read by a queued copy
        if self._ring[k].numel() < nbytes:
            self._ring[k] = self._pinned_empty(torch.Size([nbytes]), torch.uint8)
        self._turn = (k + 1) % slots
        out = self._ring[k].narrow(0, 0, nbytes).view(t.dtype).view(t.shape)
        out.copy_(t)
        self._slot_fence[k] = LENT
        return out

    def _settle_slot(self, k: int) -> None:
        fence, self._slot_fence[k] = self._slot_fence[k], None
        if fence is LENT:
            self._unconsumed_slot(k)
        elif fence is not None:
            fence.synchronize()
            self.syncs += 1

    def _slot_of(self, t: torch.Tensor) -> int | None:
        storage = t.untyped_storage()  # one Python object per live storage: identity, on any device
        return next((k for k, buf in enumerate(self._ring) if buf.untyped_storage() is storage), None)

    def host_copy(self, t: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
        """A new host copy of ``t`` (pinned when pinning), complete when this returns."""
        if self.on_host(t):
            return self.pinned(t.detach().to(dtype=dtype or t.dtype, copy=True))
        return self.down([t], dtype)[0]

    # ---- the two directions -----------------------------------------------------------------
    def down(self, tensors: list[torch.Tensor], dtype: torch.dtype | None = None) -> list[torch.Tensor]:
        """Device->host copies of ``tensors`` (host ones pass, cast when needed); readable by the CPU on return."""
        out, fence = self.queue_down(tensors, dtype)
        if fence is not None:  # one wait for all of them: the CPU reads these next
            fence.synchronize()
            self.syncs += 1
        return out

    def queue_down(self, tensors: list[torch.Tensor],
                   dtype: torch.dtype | None = None) -> tuple[list[torch.Tensor], Fence | None]:
        """:meth:`down` without the wait: the host copies and the fence to wait for before the CPU reads
        them (``None``: nothing was queued). The offload's step pipeline queues the next chunk's
        gradients this way while the CPU steps the current one."""
        out, issued = [], False
        for t in tensors:
            if self.on_host(t):
                out.append(t if dtype is None or t.dtype == dtype else t.to(dtype))
                continue
            # allocated pinned: pinning a fresh buffer would copy its uninitialised bytes once more
            dt = dtype or t.dtype
            buf = self._pinned_empty(t.shape, dt) if self.pins else torch.empty(t.shape, dtype=dt, device=HOST)
            if self.pins:
                self._issue(buf, t.detach())
            else:
                buf.copy_(t.detach())
            out.append(buf)
            issued = True
        return out, (self._fence() if issued else None)

    def side_down(self, dst: torch.Tensor, src: torch.Tensor) -> Fence | None:
        """``dst.copy_(src)`` from the device into host memory, off the compute stream when ``dst`` is pinned:
        the fence to wait for before the CPU reads ``dst``, and to order the next write of ``src`` after
        (:meth:`order_after`). ``None``: the copy is complete on return (nothing pinned, or host to host)."""
        if self.on_host(src) or not (self.pins and self.is_pinned(dst)):
            dst.copy_(src)
            return None
        return self._side_issue(dst, src)

    def copy(self, dst: torch.Tensor, src: torch.Tensor) -> Fence | None:
        """``dst.copy_(src)``; between host and device through pinned memory it is queued on the
        current stream, and the fence returned (or :meth:`wait`) is the point after which the host
        side is free to use. ``None``: the copy is complete on return."""
        queued = self.pins and self.on_host(src) != self.on_host(dst)
        host = src if self.on_host(src) else dst
        if not (queued and self.is_pinned(host)):
            dst.copy_(src)
            return None
        self._issue(dst, src)
        fence = self._pending = self._fence()  # the last one covers the earlier ones on the stream
        if host is src and (k := self._slot_of(src)) is not None:
            self._slot_fence[k] = fence  # the slot is free again once this copy is done
        return fence

    def wait(self) -> None:
        """Wait for the queued copies: before the CPU reads a buffer copied down, or overwrites one copied up."""
        if self._pending is not None:
            self._pending.synchronize()
            self._pending = None
            self.syncs += 1
            # the last fence covers every copy issued before it, the ring's included
            self._slot_fence = [f if f is LENT else None for f in self._slot_fence]
