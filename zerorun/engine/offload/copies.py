"""Host<->device copies of offload: pinned and non-blocking where CUDA is present, with their sync points.

The rules this module keeps in one place:

* host buffers are pinned only when the policy asks (``pin_memory``) and CUDA is present:
  pinning is what lets a copy to or from a GPU run asynchronously, and it needs CUDA;
* a device->host copy (:meth:`Transfers.down`) is issued ``non_blocking`` into pinned
  buffers, then waited for once, on an event recorded after the last copy on the current
  stream, before the CPU (the offloaded optimizer) reads any of them;
* any other copy between host and device through pinned memory (:meth:`Transfers.copy`)
  is ``non_blocking`` on the current stream: the kernels and collectives issued after it on
  that stream see the data (NCCL work waits on the current stream), so the device side
  needs no host sync; the host side is not to be read (device->host) or overwritten
  (host->device) by the CPU until :meth:`Transfers.wait`.

With a CPU compute device every copy is a same-device no-op and nothing is synchronised.
``cuda`` is a constructor argument so that the sync discipline is testable without a GPU.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import torch

HOST = torch.device("cpu")


class Transfers:
    def __init__(self, pin_memory: bool, cuda: ModuleType | Any = torch.cuda) -> None:
        self.cuda = cuda
        self.pins = bool(pin_memory) and bool(cuda.is_available())
        self._pending: torch.cuda.Event | None = None  # event after the last queued copy (see ``copy``)
        self.syncs = 0  # host waits, for tests and figures
        self._ring: list[torch.Tensor] = []  # pinned buffers of staged(), reused
        self._turn = 0

    # ---- seams (the only places that touch pinned memory or ask where a tensor is) -------------
    def _pin(self, t: torch.Tensor) -> torch.Tensor:
        return t.pin_memory()

    def _pinned_empty(self, shape: torch.Size, dtype: torch.dtype) -> torch.Tensor:
        return torch.empty(shape, dtype=dtype, device=HOST, pin_memory=True)

    @staticmethod
    def on_host(t: torch.Tensor) -> bool:
        return t.device.type == "cpu"

    def _fence(self) -> torch.cuda.Event:
        event = self.cuda.Event()
        event.record()  # on the current stream, after everything issued on it so far
        return event

    # ---- host buffers -----------------------------------------------------------------------
    def pinned(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` (a host tensor) in pinned memory when the policy pins, else ``t`` itself."""
        return self._pin(t) if self.pins and not t.is_pinned() else t

    def staged(self, t: torch.Tensor, slots: int = 2) -> torch.Tensor:
        """``t`` (a host tensor) copied into one of a fixed ring of pinned buffers when pinning, else ``t``.

        For data read afresh every step (swap files): pinning each read would ask torch's
        caching host allocator for a new block every time, and it keeps every block it ever
        handed out (rounded up to a power of two), so pinned memory would grow with the
        swapped bytes. The ring holds ``slots`` buffers of the largest size asked for; a slot
        is reused only after the copies queued so far are done (:meth:`wait`).
        """
        if not self.pins:
            return t
        nbytes = t.numel() * t.element_size()
        self.wait()  # the slot's previous contents may still be in a queued copy
        if len(self._ring) < slots:
            self._ring.append(self._pinned_empty(torch.Size([nbytes]), torch.uint8))
            self._turn = len(self._ring) - 1
        elif self._ring[self._turn].numel() < nbytes:
            self._ring[self._turn] = self._pinned_empty(torch.Size([nbytes]), torch.uint8)
        buf = self._ring[self._turn]
        self._turn = (self._turn + 1) % slots
        out = buf.narrow(0, 0, nbytes).view(t.dtype).view(t.shape)
        out.copy_(t)
        return out

    def host_copy(self, t: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
        """A new host copy of ``t`` (pinned when pinning), complete when this returns."""
        if self.on_host(t):
            return self.pinned(t.detach().to(dtype=dtype or t.dtype, copy=True))
        return self.down([t], dtype)[0]

    # ---- the two directions -----------------------------------------------------------------
    def down(self, tensors: list[torch.Tensor], dtype: torch.dtype | None = None) -> list[torch.Tensor]:
        """Device->host copies of ``tensors`` (host ones pass, cast when needed); readable by the CPU on return."""
        out, issued = [], False
        for t in tensors:
            if self.on_host(t):
                out.append(t if dtype is None or t.dtype == dtype else t.to(dtype))
                continue
            # allocated pinned: pinning a fresh buffer would copy its uninitialised bytes once more
            dt = dtype or t.dtype
            buf = self._pinned_empty(t.shape, dt) if self.pins else torch.empty(t.shape, dtype=dt, device=HOST)
            buf.copy_(t.detach(), non_blocking=self.pins)
            out.append(buf)
            issued = True
        if issued:  # one wait for all of them: the CPU reads these next
            self._fence().synchronize()
            self.syncs += 1
        return out

    def copy(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        """``dst.copy_(src)``; between host and device through pinned memory it is queued on the
        current stream, and :meth:`wait` is the point after which the host side is free to use."""
        queued = self.pins and self.on_host(src) != self.on_host(dst)
        host = src if self.on_host(src) else dst
        if queued and host.is_pinned():
            dst.copy_(src, non_blocking=True)
            self._pending = self._fence()  # the last one covers the earlier ones on the stream
        else:
            dst.copy_(src)

    def wait(self) -> None:
        """Wait for the queued copies: before the CPU reads a buffer copied down, or overwrites one copied up."""
        if self._pending is not None:
            self._pending.synchronize()
            self._pending = None
            self.syncs += 1
