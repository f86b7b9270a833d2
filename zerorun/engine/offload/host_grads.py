"""Where offloaded gradients live: fp32 sums in (pinned) host memory, landed as each reduction completes.

With ``offload_optimizer`` the optimizer steps on the host, so the gradient it reads is kept
there from the start, as DeepSpeed 0.19.8 keeps it (``stage_1_and_2.py``'s
``async_inplace_copy_grad_to_fp32_buffer_from_gpu``, ``stage3.py``'s ``partition_grads``):
each bucket's reduced chunk is copied to the host as soon as its reduction completes, during
backward, and the device buffer that held it is reused at once. The device keeps no gradient
shard, only the buckets in flight. :class:`HostGrads` is the
:class:`~zerorun.engine.mechanism.accumulator.GradHome` of every stage's reducer (one mechanism:
:class:`~zerorun.engine.mechanism.accumulator.ShardAccumulator` asks it).

A landing (:meth:`HostGrads.land`):

* the first chunk of a step whose dtype is the sum's (fp32 reductions) is copied straight into
  the host sum, and scaled there once the copy is done;
* any other chunk (16-bit reductions, or a later micro-step's) is copied as it is into a pinned
  slot, and once the copy is done the host casts and scales it into the sum (``land``) or adds
  it (``add_(chunk, alpha)``): the operations a device sum runs, so on the same kernel the sum
  is bit for bit the device's. DeepSpeed adds later micro-steps on the device instead (the host
  slice copied up, added, copied back); with no GPU here that variant is not built or measured.

The copies run off the compute stream (:meth:`~zerorun.engine.offload.copies.Transfers.side_down`);
the CPU waits for them, in issue order, when more than :data:`MAX_PENDING` are queued, when
backward ends and before anything reads the sums (:meth:`HostGrads.settle`).

With ``device: nvme`` the sums stay in host memory too (4 bytes per owned element): DeepSpeed's
stage 3 writes them to the swap files at the accumulation boundary and reads them back for the
step; here the step follows the boundary at once, so that round trip would only move them twice.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Collection
from dataclasses import dataclass

import torch

from zerorun.engine.comm.sums import land
from zerorun.engine.offload.copies import Fence
from zerorun.engine.offload.policy import OffloadPolicy

# landings queued before the CPU completes the oldest: bounds the pinned slots in use (a few buckets)
MAX_PENDING = 4


@dataclass
class Landing:
    fence: Fence | None
    finish: Callable[[], None] | None  # the host's part, once the copy is done


class HostGrads:
    """The host sums of the offloaded buckets (all but Twin-Flow's ``on_device`` ones)."""

    def __init__(self, policy: OffloadPolicy, on_device: Collection[int] = ()) -> None:
        self.copies = policy.transfers()
        self.on_device = frozenset(on_device)
        self.pending: deque[Landing] = deque()
        self.landings = 0  # chunks copied to the host, for tests and figures

    def hosts(self, index: int) -> bool:
        return index not in self.on_device

    def zeros(self, numel: int, dtype: torch.dtype) -> torch.Tensor:
        return self.copies.host_empty(numel, dtype).zero_()

    def reachable(self, t: torch.Tensor) -> bool:
        return self.copies.on_host(t)

    def land(self, acc: torch.Tensor, part: torch.Tensor, alpha: float, fresh: bool) -> Fence | None:
        self.landings += 1
        if fresh and part.dtype == acc.dtype:
            fence = self.copies.side_down(acc, part)
            finish = (lambda: acc.mul_(alpha)) if alpha != 1.0 else None  # land()'s rounding
        else:
            slot = self.copies.host_empty(part.numel(), part.dtype)
            fence = self.copies.side_down(slot, part)
            finish = (lambda: land(acc, slot, alpha)) if fresh else (lambda: acc.add_(slot, alpha=alpha))
        self.pending.append(Landing(fence, finish))
        while len(self.pending) > MAX_PENDING:
            self._complete_oldest()
        return fence

    def _complete_oldest(self) -> None:
        landing = self.pending.popleft()
        if landing.fence is not None:
            landing.fence.synchronize()
            self.copies.syncs += 1
        if landing.finish is not None:
            landing.finish()

    def settle(self) -> None:
        while self.pending:
            self._complete_oldest()

    def reuse_after(self, fence: Fence) -> None:
        self.copies.order_after(fence)


def grad_home(policy: OffloadPolicy | None, on_device: Collection[int]) -> HostGrads | None:
    """The host sums of an optimizer-offload ``policy`` (``None`` without offload)."""
    return HostGrads(policy, on_device) if policy is not None and policy.enabled else None
