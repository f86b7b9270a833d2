"""Parameter offload at stage 3 (``offload_param.device: cpu | nvme``): where a bucket's resting shard lives.

A :class:`~zerorun.engine.mechanism.partition.PartitionedBucket` at rest holds only ``local``, this
rank's chunk in the compute dtype. With a :class:`ParamOffload` attached:

* ``cpu``: ``local`` is a host tensor (pinned when CUDA is present and ``pin_memory``);
  the gather copies it into the compute-device buffer (``non_blocking``, stream-ordered
  before the all-gather), and the stepped shard is copied back into it after the optimizer
  step (queued; :meth:`ParamOffload.flush` waits for it at the end of the step). All the
  copies follow :mod:`zerorun.engine.offload.copies`.
* ``nvme``: ``local`` is empty; the shard lives in a swap file (the optimizer offload's
  :class:`~zerorun.engine.offload.swapper.Swapper`: ``buffer_count`` I/O threads, one
  directory per process removed on close, garbage collection and interpreter exit). A
  gather reads the file first; the coordinator's prefetch issues the reads of every bucket
  it is about to all-gather before starting the first (:meth:`ParamOffload.read_ahead`),
  so reads overlap each other and the earlier all-gathers. After the step the new shard
  is written out; every pending write is waited for before the next read.

Persistent buckets (under ``stage3_param_persistence_threshold``) stay gathered on the
compute device anyway, so their shard is not offloaded. The optimizer's fp32 master is
built as a separate copy (as with optimizer offload), so the optimizer never steps a
tensor that is swapped out. With a CPU compute device (this project's tests) the
host copies are same-device no-ops; the GPU copies run only on a GPU.
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import TYPE_CHECKING, TypeVar

import torch

from zerorun.engine.offload import copy_checks
from zerorun.engine.offload.policy import OffloadPolicy, policy_for
from zerorun.engine.offload.swapper import Swapper, release_freed_memory

if TYPE_CHECKING:
    from zerorun.config.schema_zero import ZeroConfig
    from zerorun.engine.mechanism.partition import PartitionedBucket

KEY = "zero_optimization.offload_param"
_T = TypeVar("_T")  # what a swap future resolves to: a read's tensor, a write's None


def param_policy(zero: ZeroConfig) -> OffloadPolicy:
    """The parameter-offload policy of a ``zero_optimization`` config block (stage 3 only)."""
    return policy_for(zero, "offload_param", (3,))


class ParamOffload:
    """The resting shards of a list of buckets, in host memory or swap files."""

    def __init__(self, policy: OffloadPolicy, buckets: list[PartitionedBucket]) -> None:
        assert policy.enabled
        self.policy = policy
        self.buckets = [b for b in buckets if not b.persistent]
        self.index = {id(b): i for i, b in enumerate(self.buckets)}
        self.meta = [(b.local.numel(), b.local.dtype) for b in self.buckets]
        self.swapper: Swapper | None = None
        self.reads: dict[int, Future[torch.Tensor]] = {}
        self.writes: list[Future[None]] = []
        self.read_aheads = 0  # reads issued by the prefetch before the gather that needs them
        self.copies = policy.transfers()
        self.pageable = copy_checks.transfers(False)  # host copies bound for the swap files
        if policy.device == "nvme":
            assert policy.nvme_path is not None
            need = sum(n * dt.itemsize for n, dt in self.meta)
            self.swapper = Swapper(policy.nvme_path, policy.buffer_count, need, key=KEY)
        for b in self.buckets:
            self.store(b, b.local)
            b.offload = self
        self.flush()

    @property
    def nvme(self) -> bool:
        return self.swapper is not None

    # ---- bucket hooks -----------------------------------------------------------------------
    def store(self, bucket: PartitionedBucket, shard: torch.Tensor) -> None:
        """The bucket's new resting shard (compute dtype): into host memory, or written to its file."""
        i = self.index[id(bucket)]
        if self.swapper is None:
            # "not in host memory" as the copier sees it (the deferred stand-in's device is the CPU too)
            if bucket.local is None or not self.copies.on_host(bucket.local) or bucket.local.numel() == 0:
                bucket.local = self.copies.host_copy(shard, self.meta[i][1])  # the compute dtype: a master is fp32
            else:
                self.copies.copy(bucket.local, shard)  # queued from a device; waited for in flush()
            return
        self.reads.pop(i, None)
        # pageable: the copy is written to its file and freed; pinned, torch's caching host allocator would
        # keep a block per shard (NVMe would pin as much as cpu offload)
        self.writes.append(self.swapper.write(f"p{i}", self.pageable.host_copy(shard, self.meta[i][1])))
        bucket.local = torch.empty(0, dtype=self.meta[i][1], device="cpu")

    def read_ahead(self, bucket: PartitionedBucket) -> None:
        """Start reading the bucket's shard (nvme) so that :meth:`fetch` finds it in flight."""
        if self.swapper is None or id(bucket) not in self.index:
            return
        i = self.index[id(bucket)]
        if i not in self.reads:
            self.flush()
            self.reads[i] = self.swapper.read(f"p{i}", *self.meta[i])
            self.read_aheads += 1

    def fetch(self, bucket: PartitionedBucket) -> torch.Tensor:
        """The bucket's resting shard, ready to copy into its gather buffer (host; pinned when pinning)."""
        if self.swapper is None:
            return bucket.local
        i = self.index[id(bucket)]
        if i not in self.reads:
            self.flush()
            self.reads[i] = self.swapper.read(f"p{i}", *self.meta[i])
        return self.copies.staged(self._wait(self.reads.pop(i)))  # pinned through a fixed ring: no growth

    def upload(self, dst: torch.Tensor, shard: torch.Tensor) -> None:
        """Copy a fetched resting shard into its gather buffer on the compute device.

        Through the copier, never a bare ``non_blocking`` copy: a swapped shard sits in a slot of
        the pinned ring, and the copy's fence is what lets the ring reuse the slot only once the
        stream has read it (a bare copy left nothing to wait for: the third fetch overwrote slot 0
        while the first copy was still queued behind compute).
        """
        self.copies.copy(dst, shard)

    # ---- life cycle ---------------------------------------------------------------------------
    def _wait(self, future: Future[_T]) -> _T:
        try:
            return future.result()
        except BaseException:
            self.close()  # a failed swap leaves no files behind
            raise

    def flush(self) -> None:
        """Wait for every pending write (before a read of the same file, and at the end of a step)."""
        self.copies.wait()
        writes, self.writes = self.writes, []
        for f in writes:
            self._wait(f)
        if writes:
            release_freed_memory()

    def resident_bytes(self) -> int:
        """Bytes of resting shards held in memory (host or device); 0 for nvme between steps."""
        return sum(b.local.numel() * b.local.element_size() for b in self.buckets if b.local is not None)

    def close(self) -> None:
        """Remove the swap files (nvme); also done at garbage collection and interpreter exit."""
        if self.swapper is not None:
            self.reads.clear()
            self.writes = []
            self.swapper.close()
