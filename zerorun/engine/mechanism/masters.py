"""fp32 master weights and optimizer state for the chunk of each bucket this rank owns.

A stock ``torch.optim`` optimizer steps one flat 1-D tensor per bucket (so foreach and
fused kernels see a few large tensors). The owned chunk is the whole bucket when the
optimizer is not sharded (stage 0) and the rank's chunk otherwise (stages 1, 2).

With fp32 compute the master *is* the owned chunk of the parameter buffer (an alias: no
extra bytes, nothing to copy back); with fp16/bf16 it is a separate fp32 copy taken from
the fp32 parameters before they are cast, and the step ends by casting it back into the
compute buffer. When sharded, an all-gather per bucket then hands every rank the
updated parameters. With sharded parameters (:class:`PartitionedMasters`) the master is
over each bucket's resting shard and the step writes the shard; the next forward gathers.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch
from torch import nn

from zerorun.engine.comm.collectives import Collectives
from zerorun.engine.mechanism.buckets import FlatBucket
from zerorun.engine.mechanism.gather import GatherCoordinator
from zerorun.engine.mechanism.partition import PartitionedBucket
from zerorun.engine.mechanism.shard_store import ShardStore
from zerorun.engine.numerics.compensated import Compensation
from zerorun.engine.offload.copies import Fence

Copier = Callable[[torch.Tensor, torch.Tensor], "Fence | None"]  # dst, src -> the copy's fence (None: done)


def _plain_copy(dst: torch.Tensor, src: torch.Tensor) -> None:
    dst.copy_(src)


class MasterShards:
    def __init__(self, buckets: list[FlatBucket], sharded: bool, alias: bool, overlap_gather: bool = False,
                 masters: list[torch.Tensor] | None = None, dtype: torch.dtype = torch.float32) -> None:
        """Create masters from the buckets' current (fp32) data; call before casting the buckets.

        ``masters``: their data taken already, bucket by bucket (stages 0-2's streamed set-up,
        :mod:`zerorun.engine.flat_setup`), then the buckets may be cast already.
        ``overlap_gather``: all-gather each bucket while the next one steps (the engine sets it
        on CUDA, see :meth:`step`). ``dtype``: the masters' (fp32, or bf16 with bf16 masters).
        """
        self.buckets = buckets
        self.sharded = sharded
        self.alias = alias
        self.overlap_gather = overlap_gather
        self.masters: list[nn.Parameter] = []
        self.compensation: Compensation | None = None  # bf16 masters' bf16.master_compensation
        for i, b in enumerate(buckets):
            if masters is not None:
                data = masters[i]
            else:
                owned = self.owned(b, b.data)
                data = owned if alias else owned.detach().clone().to(dtype)
            self.masters.append(nn.Parameter(data, requires_grad=True))

    def owned(self, bucket: FlatBucket, flat: torch.Tensor) -> torch.Tensor:
        return bucket.shard(flat) if self.sharded else flat

    def set_compensation(self, compensation: Compensation | None) -> None:
        self.compensation = compensation

    def rebind(self) -> None:
        """After the buckets are cast to the compute dtype, alias masters must follow the new buffers."""
        if self.alias:
            for b, m in zip(self.buckets, self.masters, strict=True):
                m.data = self.owned(b, b.data)

    def bind_optimizer(self, optimizer: torch.optim.Optimizer, group_of_bucket: list[int]) -> None:
        """Replace the optimizer's parameters with the master tensors, keeping each group's settings."""
        self.group_of_bucket = list(group_of_bucket)
        groups: dict[int, list[nn.Parameter]] = {}
        for gi, m in zip(group_of_bucket, self.masters, strict=True):
            groups.setdefault(gi, []).append(m)
        for gi, group in enumerate(optimizer.param_groups):
            group["params"] = groups.get(gi, [])
        optimizer.state.clear()

    def step_chunks(self) -> list[list[int]]:
        """Bucket indices stepped together: consecutive buckets up to the largest bucket's size.

        The optimizer's temporaries (foreach AdamW's ``sqrt(v)``, the fp32 copies of 16-bit
        gradients) are then never more than one bucket's worth, whatever the model's size,
        and small buckets (norms, biases) still share one optimizer call.
        """
        limit = max((m.numel() for m in self.masters), default=0)
        chunks: list[list[int]] = []
        size = limit + 1
        for i, m in enumerate(self.masters):
            if size + m.numel() > limit:
                chunks.append([])
                size = 0
            chunks[-1].append(i)
            size += m.numel()
        return chunks

    def step(self, optimizer: torch.optim.Optimizer, owned_grads: list[torch.Tensor], multiplier: float,
             coll: Collectives) -> None:
        """One optimizer step, a chunk of buckets at a time, then (when sharded) the all-gathers.

        ``owned_grads`` are the reduced gradients of the owned chunks; ``multiplier`` unscales
        and clips. Each chunk steps through the optimizer alone: its groups are pointed at the
        chunk's masters for the call (DeepSpeed steps its sub-groups the same way), so a call
        costs the chunk, not the model. With ``overlap_gather`` (the engine sets it on CUDA)
        each chunk's all-gathers run (on NCCL's stream) while the next chunk steps. On the CPU
        the all-gather's copies run on gloo's threads, on the cores the step runs on, and the
        step is memory-bound: overlapped, both slowed down (measured on 2 gloo ranks, the
        25.5M-parameter benchmark: stage 1 at 0.99x DDP's step time overlapped, 0.91x stepped
        whole and then gathered).
        """
        overlap = self.overlap_gather and self.sharded
        pending = []
        with self.stepping(optimizer):
            for chunk in self.step_chunks():
                self.step_chunk(optimizer, chunk, [owned_grads[i] for i in chunk], multiplier)
                if overlap:
                    for i in chunk:
                        self.write_back(i)
                        pending.append(coll.all_gather(self.buckets[i].data, async_op=True))
        if not overlap:
            self.publish(coll)
        for p in pending:
            p.wait()

    @contextlib.contextmanager
    def stepping(self, optimizer: torch.optim.Optimizer) -> Iterator[None]:
        """A span of :meth:`step_chunk` calls; the optimizer's groups hold all the masters again after it."""
        kept = [g["params"] for g in optimizer.param_groups]
        try:
            yield
        finally:
            for g, params in zip(optimizer.param_groups, kept, strict=True):
                g["params"] = params

    def step_chunk(self, optimizer: torch.optim.Optimizer, chunk: list[int], grads: list[torch.Tensor],
                   multiplier: float) -> None:
        """Step the masters of bucket indices ``chunk`` alone (inside :meth:`stepping`), with ``grads``."""
        groups = optimizer.param_groups
        for g in groups:
            g["params"] = []
        for i in chunk:
            groups[self.group_of_bucket[i]]["params"].append(self.masters[i])
        masters = [self.masters[i] for i in chunk]
        self.set_grads_of(masters, grads, multiplier)
        with self.compensation.widened(optimizer, masters) if self.compensation else contextlib.nullcontext():
            optimizer.step()
        for i in chunk:
            self.masters[i].grad = None

    def write_back(self, i: int, copy: Copier | None = None) -> Fence | None:
        """Bucket ``i``'s stepped master into its compute buffer (nothing to do when the master is the buffer);
        ``copy(dst, src)`` makes the copy (default: ``dst.copy_(src)``) and its fence is returned."""
        if self.alias:
            return None
        b = self.buckets[i]
        with torch.no_grad():
            return (copy or _plain_copy)(self.owned(b, b.data), self.masters[i])

    def after_writes(self, coll: Collectives, gathered: bool = False) -> None:
        """What follows the write-backs: the all-gathers of sharded buckets (unless ``gathered`` already)."""
        if self.sharded and not gathered:
            for p in [coll.all_gather(b.data, async_op=True) for b in self.buckets]:
                p.wait()

    # The whole-step sequence: set_grads -> optimizer.step -> clear_grads -> publish.
    def set_grads(self, owned_grads: list[torch.Tensor], multiplier: float) -> None:
        self.set_grads_of(self.masters, owned_grads, multiplier)

    @staticmethod
    def set_grads_of(masters: list[nn.Parameter], grads: list[torch.Tensor], multiplier: float) -> None:
        """Each master's gradient in its own dtype (fp32, or bf16 masters' bf16 gradients), times ``multiplier``."""
        for m, g in zip(masters, grads, strict=True):
            gm = g if g.dtype == m.dtype else g.to(m.dtype)
            if multiplier != 1.0:
                gm.mul_(multiplier)
            m.grad = gm

    def clear_grads(self) -> None:
        for m in self.masters:
            m.grad = None

    def publish(self, coll: Collectives) -> None:
        """Copy masters into the compute buffers and, when sharded, all-gather the buckets."""
        for i in range(len(self.buckets)):
            self.write_back(i)
        self.after_writes(coll)

    def held_bytes(self) -> int:
        return 0 if self.alias else sum(m.numel() * m.element_size() for m in self.masters)


def optimizer_state_bytes(optimizer: torch.optim.Optimizer) -> int:
    total = 0
    for state in optimizer.state.values():
        for v in state.values():
            if torch.is_tensor(v):
                total += v.numel() * v.element_size()
    return total


class PartitionedMasters(MasterShards):
    """Masters over each bucket's ``local`` chunk (the fp32 shard itself with fp32 compute)."""

    def __init__(self, buckets: list[PartitionedBucket], alias: bool, coordinator: GatherCoordinator,
                 dtype: torch.dtype = torch.float32) -> None:
        super().__init__(buckets, sharded=True, alias=alias, dtype=dtype)  # type: ignore[arg-type]
        self.coordinator = coordinator
        self.param_offload: ShardStore | None = None
        for b, m in zip(buckets, self.masters, strict=True):
            b.master = None if alias else m.data

    def owned(self, bucket: PartitionedBucket, flat: torch.Tensor) -> torch.Tensor:
        return bucket.master if bucket.master is not None else bucket.local

    # step() is MasterShards' whole step; no all-gather follows it here (the next forward gathers)
    def write_back(self, i: int, copy: Copier | None = None) -> Fence | None:
        """Bucket ``i``'s stepped master into its resting shard: through ``copy`` when the shard is in
        memory, into the parameter offload's store otherwise (that store's own writes)."""
        if self.alias:
            return None
        b, m = self.buckets[i], self.masters[i]
        with torch.no_grad():
            if b.offload is not None or copy is None:
                b.set_local(m)
                return None
            assert b.local is not None
            return copy(b.local, m)

    def after_writes(self, coll: Collectives, gathered: bool = False) -> None:
        """The new shards are on disk before anything reads them (nvme); gathered buckets re-gather or are released."""
        if self.param_offload is not None:
            self.param_offload.flush()
        self.coordinator.after_step()
