"""Checking modes of :class:`~zerorun.engine.comm.collectives.Collectives`: CPU stand-ins for a GPU.

On gloo an asynchronous collective has usually finished by the time the engine looks at its
buffer, and every tensor is on the one device there is, so two classes of GPU bugs cannot show
in CPU tests: reading or reusing a buffer before its collective is waited for (on NCCL the
kernel runs later, on another stream), and handing torch.distributed a tensor on the wrong
device. ``ZERORUN_CHECK_COLLECTIVES`` (a comma-separated list, for tests; spawned ranks
inherit it) turns on:

``deferred``
    Every asynchronous collective runs on a private copy of its buffer taken at issue (what
    the collective reads is the buffer as it was then), and the buffer itself holds poison
    (NaN; a sentinel for integers) until ``wait()``, which copies the result in. A read
    before ``wait()`` gets poison (the parity suites then fail), and a buffer written or
    freed (its storage resized or replaced) before ``wait()`` raises
    :class:`CollectiveBufferError`.
``device``
    Every tensor about to reach torch.distributed is checked to be on the group's device
    (index included); another raises :class:`CollectiveDeviceError`.
``native``
    The NCCL policy on gloo: native reduce-scatter / all-gather-into-tensor (gloo has both)
    instead of the point-to-point exchanges and the shared-memory lane, and buckets laid
    out at the configured ``reduce_bucket_size`` instead of the gloo cap.
``live``
    Every collective is issued even at world size 1, where the engine would skip it: on one
    GPU (the GPU check) NCCL's kernels, the asynchronous works, their waits and the buffers
    freed after them then run as they do at world N.
``order``
    Every rank issues the same collectives in the same order, compared before each one runs,
    on every backend (:mod:`zerorun.engine.comm.order_check`); cheap enough for a first run.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

import torch

from zerorun import torch_compat
from zerorun.engine.check_modes import env_modes

if TYPE_CHECKING:
    from zerorun.engine.comm.work import Work

CHECK_ENV = "ZERORUN_CHECK_COLLECTIVES"
MODES = frozenset({"deferred", "device", "live", "native", "order"})
_INT_POISON = -0x5A5A5A5A  # what an integer buffer holds while its collective is in flight


class CollectiveBufferError(AssertionError):
    """A buffer was written or freed while its collective was in flight."""


class CollectiveDeviceError(AssertionError):
    """A tensor reached torch.distributed off the group's device."""


def check_modes(env: Mapping[str, str] = os.environ) -> frozenset[str]:
    """The modes ``ZERORUN_CHECK_COLLECTIVES`` turns on (none when unset)."""
    return env_modes(CHECK_ENV, MODES, env)


def check_device(kind: str, device: torch.device, tensors: list[torch.Tensor]) -> None:
    for t in tensors:
        if t.device != device:
            raise CollectiveDeviceError(f"{kind} got a tensor on {t.device}, but the group's device is {device}")


def _poison(t: torch.Tensor) -> None:
    if t.is_floating_point() or t.is_complex():
        t.fill_(float("nan"))
    elif t.dtype == torch.bool:
        t.fill_(True)
    else:
        t.fill_(_INT_POISON if t.element_size() >= 4 else -0x5A)


def _still_poisoned(t: torch.Tensor) -> bool:
    if t.is_floating_point() or t.is_complex():
        return bool(torch.isnan(t).all())
    if t.dtype == torch.bool:
        return bool(t.all())
    return bool((t == (_INT_POISON if t.element_size() >= 4 else -0x5A)).all())


class DeferredWork:
    """An asynchronous collective whose buffer the engine may not touch until :meth:`wait`."""

    def __init__(self, kind: str, buffer: torch.Tensor, staged: torch.Tensor, work: Work) -> None:
        self.kind = kind
        self.buffer = buffer
        self.staged = staged
        self.work = work
        self.storage = (buffer.untyped_storage().data_ptr(), buffer.untyped_storage().nbytes())
        self.version = torch_compat.version_counter(buffer)  # in-place writes bump it (NaN arithmetic would keep the poison)

    def wait(self) -> None:
        self.work.wait()
        storage = self.buffer.untyped_storage()
        what = f"the buffer of an asynchronous {self.kind} ({self.buffer.numel()} {self.buffer.dtype})"
        if (storage.data_ptr(), storage.nbytes()) != self.storage:
            raise CollectiveBufferError(f"{what} was freed or reallocated before its wait(): on a GPU the "
                                        "collective would still be writing into released memory")
        if torch_compat.version_counter(self.buffer) != self.version or not _still_poisoned(self.buffer):
            raise CollectiveBufferError(f"{what} was written before its wait(): on a GPU the collective's "
                                        "result would overwrite that write, or race with it")
        self.buffer.copy_(self.staged)


def defer(kind: str, buffer: torch.Tensor, issue: Callable[[torch.Tensor], Work]) -> DeferredWork:
    """Issue ``issue`` on a copy of ``buffer`` taken now, and poison ``buffer`` until the wait."""
    staged = buffer.clone()
    work = issue(staged)
    _poison(buffer)
    return DeferredWork(kind, buffer, staged, work)
