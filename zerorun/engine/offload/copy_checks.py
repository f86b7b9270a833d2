"""A CPU stand-in for asynchronous host<->device copies (``ZERORUN_CHECK_COPIES=deferred``).

On a GPU a ``non_blocking`` copy through pinned memory runs later, on the stream, and the
host learns it is done only by waiting for an event recorded after it. On the CPU every
copy is done when it returns, so a missing wait cannot show in a CPU test. This mode makes
it show: the offload's :class:`~zerorun.engine.offload.copies.Transfers` become
:class:`DeferredTransfers`, which pretend CUDA is present (when the policy pins), keep
their own "pinned" host buffers (a registry: the CPU has no pinned memory) and treat every
other tensor as a device tensor. Then, for every copy they queue:

* device->host: the copy is deferred until its fence is waited for. Until then the
  destination holds poison (NaN, or a sentinel for integers), so a host read before the
  wait gets poison (the parity suites fail); a destination written or freed before the wait
  raises :class:`CopyRaceError`. What lands is the source as it was when the copy was issued
  (what the stream would have copied).
* host->device: the destination is written at once (the device work after it on the stream
  sees it), and the host source must stay as it was until the copy's fence is waited for: at
  the wait it is compared with a snapshot taken at issue, and a source changed meanwhile
  poisons the destination and raises :class:`CopyRaceError`.
* a slot of the pinned ring (:meth:`Transfers.staged`) reused before the copy that read it
  was waited for, or never read through :meth:`Transfers.copy` at all (then nothing could
  wait for the copy: it was issued elsewhere), raises :class:`CopyRaceError` at the reuse.
* a side-stream copy (:meth:`Transfers.side_down`, a reduced gradient chunk going to its host
  sum) is device->host as above, and its device source is watched too: the side stream is
  not ordered with the compute stream, so a source written before the copy's fence was
  passed (waited for, or :meth:`Transfers.order_after`: here the CPU is the compute stream,
  so ordering after the fence completes the copy) raises :class:`CopyRaceError`.

Every stand-in transfer shares one :class:`CopyStream` per process (on a GPU they share the
current stream: an event recorded by one covers the copies queued by all before it).
Spawned ranks inherit the variable; the parity suites run under it (tests/engine/offload/).
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from zerorun import torch_compat
from zerorun.engine.check_modes import env_modes
from zerorun.engine.offload.copies import Fence, Transfers

CHECK_ENV = "ZERORUN_CHECK_COPIES"
MODES = frozenset({"deferred"})
_INT_POISON = -0x5A5A5A5A


class CopyRaceError(AssertionError):
    """A host buffer of a queued copy was used before the copy was waited for."""


def check_modes(env: Mapping[str, str] = os.environ) -> frozenset[str]:
    """The modes ``ZERORUN_CHECK_COPIES`` turns on (none when unset)."""
    return env_modes(CHECK_ENV, MODES, env)


def poison(t: torch.Tensor) -> None:
    if t.is_floating_point() or t.is_complex():
        t.fill_(float("nan"))
    elif t.dtype == torch.bool:
        t.fill_(True)
    else:
        t.fill_(_INT_POISON if t.element_size() >= 4 else -0x5A)


def poisoned(t: torch.Tensor) -> bool:
    """Every element still holds what :func:`poison` wrote."""
    twin = torch.empty_like(t)
    poison(twin)
    return _same(t, twin)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit-for-bit equal (NaN equals NaN)."""
    if a.is_floating_point() or a.is_complex():
        return bool((a.eq(b) | (a.isnan() & b.isnan())).all())
    return torch.equal(a, b)


def _storage_key(t: torch.Tensor) -> tuple[int, int]:
    """The storage's identity and size: torch keeps one Python object per live storage (``meta``
    storages have no address to tell them apart), so the id is stable while the bytes live."""
    s = t.untyped_storage()
    return id(s), s.nbytes()


@dataclass
class InFlight:
    """One queued copy: ``to_host`` (device->host, deferred) or host->device (source watched)."""

    seq: int
    to_host: bool
    dst: torch.Tensor
    src: torch.Tensor
    snapshot: torch.Tensor
    dst_storage: tuple[int, int]
    dst_version: int
    side: bool = False  # issued on the side stream: its device source must stay as it was until the fence

    def complete(self) -> None:
        if self.side and not _same(self.src, self.snapshot):
            raise CopyRaceError(f"the device source of a side-stream copy of {self.dst.numel()} {self.dst.dtype} "
                                "(device->host) was written before the copy's fence was passed: on a GPU the "
                                "copy may read the new bytes (order the write after it: Transfers.order_after)")
        self._complete()

    def _complete(self) -> None:
        what = f"a non_blocking copy of {self.dst.numel()} {self.dst.dtype}"
        if self.to_host:
            if _storage_key(self.dst) != self.dst_storage:
                raise CopyRaceError(f"the pinned destination of {what} (device->host) was freed or reallocated "
                                    "before its fence was waited for: on a GPU the copy writes released memory")
            # a view shares its version counter with the views beside it (one flat buffer of sums): there,
            # a write to this one is told by the poison it overwrote
            shares_storage = self.dst.untyped_storage().nbytes() != self.dst.numel() * self.dst.element_size()
            written = (not poisoned(self.dst) if shares_storage
                       else torch_compat.version_counter(self.dst) != self.dst_version)
            if written:
                raise CopyRaceError(f"the pinned destination of {what} (device->host) was written before its "
                                    "fence was waited for: on a GPU the copy overwrites that write later")
            self.dst.copy_(self.snapshot)
        elif not _same(self.src, self.snapshot):
            if self.dst.untyped_storage().nbytes():
                poison(self.dst)
            raise CopyRaceError(f"the pinned source of {what} (host->device) was overwritten before its fence "
                                "was waited for: on a GPU the copy may read the new bytes")


class CopyStream:
    """The stand-in's current stream: copies in flight in issue order, and the "pinned" host buffers."""

    def __init__(self, host: torch.device | str = "cpu") -> None:
        """``host``: where the "pinned" buffers are made (``meta`` in a simulated world of any size)."""
        self.seq = 0
        self.host = torch.device(host)
        self.inflight: list[InFlight] = []
        # by storage (torch keeps one Python object per live storage): a parameter whose .data was set
        # to a pinned tensor is pinned, whatever became of that tensor's own object
        self._pinned: dict[tuple[int, int], weakref.ref[torch.UntypedStorage]] = {}
        self.allocating_host = False  # true while a pinned buffer is being made (an allocation ledger reads it)

    def register(self, t: torch.Tensor) -> torch.Tensor:
        self._pinned[_storage_key(t)] = weakref.ref(t.untyped_storage())
        return t

    def host_empty(self, shape: torch.Size, dtype: torch.dtype) -> torch.Tensor:
        self.allocating_host = True
        try:
            return self.register(torch.empty(shape, dtype=dtype, device=self.host))
        finally:
            self.allocating_host = False

    def host_clone(self, t: torch.Tensor) -> torch.Tensor:
        out = self.host_empty(t.shape, t.dtype)
        out.copy_(t)
        return out

    def is_pinned(self, t: torch.Tensor) -> bool:
        storage = t.untyped_storage()
        ref = self._pinned.get((id(storage), storage.nbytes()))
        return ref is not None and ref() is storage

    def issue(self, dst: torch.Tensor, src: torch.Tensor, to_host: bool, side: bool = False) -> None:
        self.seq += 1
        snapshot = src.detach().clone()
        if to_host:
            poison(dst)
        else:
            dst.copy_(src)
        self.inflight.append(InFlight(self.seq, to_host, dst, src, snapshot, _storage_key(dst), torch_compat.version_counter(dst), side))

    def complete(self, upto: int) -> None:
        done = [c for c in self.inflight if c.seq <= upto]
        self.inflight = [c for c in self.inflight if c.seq > upto]
        for c in done:
            c.complete()

    def reading(self, host: torch.Tensor) -> list[InFlight]:
        """Copies in flight whose host side is ``host``'s storage."""
        storage = host.untyped_storage()
        return [c for c in self.inflight if (c.dst if c.to_host else c.src).untyped_storage() is storage]


class StandInEvent:
    def __init__(self, stream: CopyStream) -> None:
        self.stream = stream
        self.upto = 0

    def record(self) -> None:
        self.upto = self.stream.seq

    def synchronize(self) -> None:
        self.stream.complete(self.upto)


class StandInCuda:
    """What :class:`Transfers` asks of ``torch.cuda``: available, events on the stand-in stream."""

    def __init__(self, stream: CopyStream) -> None:
        self.stream = stream

    def is_available(self) -> bool:
        return True

    def Event(self) -> StandInEvent:  # noqa: N802 - torch.cuda's name
        return StandInEvent(self.stream)

    def synchronize(self) -> None:
        self.stream.complete(self.stream.seq)


class DeferredTransfers(Transfers):
    """:class:`Transfers` over the stand-in stream: queued copies are deferred or watched until waited for."""

    def __init__(self, pin_memory: bool, stream: CopyStream) -> None:
        super().__init__(pin_memory, StandInCuda(stream))
        self.stream = stream

    def _pin(self, t: torch.Tensor) -> torch.Tensor:
        return self.stream.host_clone(t)

    def _pinned_empty(self, shape: torch.Size, dtype: torch.dtype) -> torch.Tensor:
        return self.stream.host_empty(shape, dtype)

    def is_pinned(self, t: torch.Tensor) -> bool:
        return self.stream.is_pinned(t)

    def on_host(self, t: torch.Tensor) -> bool:
        return self.stream.is_pinned(t)  # every other tensor stands for a device tensor

    def _issue(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        self.stream.issue(dst, src, to_host=self.on_host(dst))

    def _side_issue(self, dst: torch.Tensor, src: torch.Tensor) -> StandInEvent:
        self.stream.issue(dst, src, to_host=True, side=True)
        event = StandInEvent(self.stream)
        event.record()
        return event

    def order_after(self, fence: Fence) -> None:
        fence.synchronize()  # the CPU is the compute stream: its next write runs now

    def _settle_slot(self, k: int) -> None:
        super()._settle_slot(k)
        if self.stream.reading(self._ring[k]):  # a copy of the slot that the slot's fence did not cover
            raise CopyRaceError(f"pinned ring slot {k} is reused while a copy that reads it is still in flight")

    def _unconsumed_slot(self, index: int) -> None:
        raise CopyRaceError(f"pinned ring slot {index} (Transfers.staged) is reused, but no copy through "
                            "Transfers.copy read it: the copy that did was issued elsewhere, so nothing waited "
                            "for it before the slot is overwritten (on a GPU it may read the new bytes)")


_STREAM: list[CopyStream] = []  # one per process, made on first use: the stand-in of the current stream


def stream() -> CopyStream:
    """This process's stand-in stream (made on first use, on the simulation's device when one runs)."""
    if not _STREAM:
        from zerorun import simulate

        _STREAM.append(CopyStream("meta" if simulate.device_type() == "meta" else "cpu"))
    return _STREAM[0]


class _NoStream:
    """The copy engine of a simulated world on meta (``zerorun.simulate``): no CUDA, every copy done on return."""

    class Event:
        def record(self) -> None: ...

        def synchronize(self) -> None: ...

    @staticmethod
    def is_available() -> bool:
        return False


def transfers(pin_memory: bool) -> Transfers:
    """The transfers of an offload policy: the stand-in when ``ZERORUN_CHECK_COPIES=deferred``."""
    if "deferred" not in check_modes():
        from zerorun import simulate

        # simulated on meta, a copy from the (meta) device lands in fake host memory at once: no stream
        return Transfers(pin_memory, _NoStream if simulate.device_type() == "meta" else torch.cuda)
    return DeferredTransfers(pin_memory, stream())
