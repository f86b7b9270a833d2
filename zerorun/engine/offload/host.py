"""Optimizer offload to host memory (``offload_optimizer.device: cpu``), stages 1-3.

Wraps the stage's master shards (built non-aliased, so each is a separate fp32 copy)
and moves the masters to host memory; the optimizer then steps there, with torch's fused
CPU kernel for the optimizers torch fuses (:mod:`zerorun.engine.training.host_kernel`) on
the threads the node's ranks leave idle while they wait for it (:mod:`.threads`).

The step is a pipeline over the chunks the step already has
(:meth:`MasterShards.step_chunks`), three stages deep, through
:class:`~zerorun.engine.offload.copies.Transfers` (pinned, ``non_blocking`` on a GPU):

    chunk k+1's gradients are queued down  |  chunk k steps on the CPU  |  chunk k-1's masters go up

(the gradients of offloaded buckets are in host memory already, landed there during backward by
:mod:`.host_grads`: their "queue down" passes them through, so only the uploads overlap the step)

The CPU waits for chunk k's own down-copy fence only, right before it steps it, and
queues chunk k's upload as soon as it is stepped: on a GPU the copy engine moves chunk
k+1 down and chunk k-1 up while the CPU steps chunk k. The uploads are waited for before
the next step writes the masters again (:meth:`HostMasters.step` starts with that wait),
so the CPU never changes a master an upload still reads. NVMe offload adds its reads and
writes to the same pipeline (:mod:`.nvme`). The gradients are complete before the first
chunk steps (the global norm, for clipping and the overflow check, needs all of them), so
the step does not overlap the reductions themselves.

Twin-Flow (``offload_optimizer.ratio`` < 1, stage 3): DeepSpeed 0.19.8's split
(``stage3.py``, ``subgroup_to_device``): of the ``n`` buckets (its sub-groups), bucket ``i``
is offloaded when ``i >= int((1 - ratio) * n)``; the first ones keep their master and
optimizer state on the compute device and step there (the same optimizer: torch's kernels
group tensors by device), with no copies.

With a CPU compute device (this project's tests) every copy is a no-op on the same
device, so the path runs but moves nothing; under ``ZERORUN_CHECK_COPIES=deferred`` the
copies are deferred until their fences (:mod:`.copy_checks`), which is how the tests see
the pipeline's order.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from zerorun.engine.comm.collectives import Collectives
from zerorun.engine.offload import copy_checks, hugepages
from zerorun.engine.offload.copies import Fence
from zerorun.engine.offload.policy import OffloadPolicy
from zerorun.engine.offload.threads import step_threads, threads_for_step

if TYPE_CHECKING:
    from zerorun.engine.mechanism.masters import MasterShards


def device_buckets(n: int, ratio: float) -> range:
    """The bucket indices whose state stays on the compute device at offload ``ratio`` (DeepSpeed's split)."""
    return range(int((1 - ratio) * n)) if ratio < 1.0 else range(0)


class HostMasters:
    """The wrapped masters with their data in host memory; anything not overridden is delegated."""

    def __init__(self, inner: MasterShards, policy: OffloadPolicy) -> None:
        assert not inner.alias, "offloaded masters must be separate copies (build them with alias=False)"
        self.inner = inner
        self.policy = policy
        self.copies = policy.transfers()
        self.threads = step_threads()
        self.on_device = frozenset(device_buckets(len(inner.masters), policy.ratio))
        self.master_dtype = inner.masters[0].dtype if inner.masters else torch.float32
        # nvme writes the masters to files and frees them: pinned, torch's host cache would keep them
        home = self.copies if policy.device == "cpu" else copy_checks.transfers(False)
        # masters and state that stay in host memory step faster in huge pages (nvme reads them afresh)
        self.huge = policy.device == "cpu" and hugepages.wanted()
        for i, (b, m) in enumerate(zip(inner.buckets, inner.masters, strict=True)):
            if i in self.on_device:
                continue
            if home.on_host(m.data):
                m.data = home.pinned(m.data)  # taken on the host already (stages 0-2's set-up)
            else:
                m.data = home.host_copy(m.data, m.dtype)  # fp32, or bf16 masters
            if self.huge and not home.is_pinned(m.data):  # pinned memory stays where the copier put it
                m.data = hugepages.huge_copy(m.data)
            if getattr(b, "master", None) is not None:  # stage 3 buckets keep a handle on their master
                b.master = m.data

    def __getattr__(self, name: str) -> Any:  # the wrapped masters' attribute, whatever it is
        return getattr(self.inner, name)

    # ---- the pipeline -------------------------------------------------------------------------
    def step(self, optimizer: torch.optim.Optimizer, owned_grads: list[torch.Tensor], multiplier: float,
             coll: Collectives) -> None:
        inner = self.inner
        chunks = inner.step_chunks()
        gather = inner.overlap_gather and inner.sharded  # CUDA: each chunk's all-gather follows its upload
        pending = []
        self.copies.wait()  # the last step's uploads read the masters this step writes
        with threads_for_step(self.threads), inner.stepping(optimizer):
            queued = self._queue_down(chunks[0], owned_grads) if chunks else ([], None)
            for k, chunk in enumerate(chunks):
                grads, fence = queued
                if k + 1 < len(chunks):  # the next chunk comes down while this one steps
                    queued = self._queue_down(chunks[k + 1], owned_grads)
                self.before_chunk(chunk, chunks[k + 1] if k + 1 < len(chunks) else None)
                if fence is not None:
                    fence.synchronize()
                inner.step_chunk(optimizer, chunk, grads, multiplier)
                if self.huge:  # the state this chunk's first step made, once
                    hugepages.settle_state(optimizer, [inner.masters[i] for i in chunk if i not in self.on_device])
                for i in chunk:  # up while the next chunk steps
                    inner.write_back(i, self._copy_up if i not in self.on_device else None)
                    if gather:
                        pending.append(coll.all_gather(inner.buckets[i].data, async_op=True))
                self.after_chunk(chunk)
        inner.after_writes(coll, gathered=gather)
        for p in pending:
            p.wait()

    def _queue_down(self, chunk: list[int], owned_grads: list[torch.Tensor]
                    ) -> tuple[list[torch.Tensor], Fence | None]:
        grads = [owned_grads[i] for i in chunk]
        host = [k for k, i in enumerate(chunk) if i not in self.on_device]
        out, fence = self.copies.queue_down([grads[k] for k in host], self.master_dtype)
        for k, g in zip(host, out, strict=True):
            grads[k] = g
        return grads, fence

    def _copy_up(self, dst: torch.Tensor, src: torch.Tensor) -> Fence | None:
        return self.copies.copy(dst, src)

    def before_chunk(self, chunk: list[int], following: list[int] | None) -> None:
        """Hook: ``chunk`` is about to step and ``following`` steps next (NVMe: reads them in)."""

    def after_chunk(self, chunk: list[int]) -> None:
        """Hook: ``chunk`` is stepped and its uploads are queued (NVMe: writes it out)."""

    # ---- the engine's older step sequence: set_grads -> optimizer.step -> clear_grads -> publish ----
    def to_host(self, grads: list[torch.Tensor]) -> list[torch.Tensor]:
        """Gradient shards where their masters are, fp32, complete: the step reads them next."""
        self.copies.wait()  # nothing queued may still touch the masters the CPU is about to step
        out, fence = self._queue_down(list(range(len(grads))), grads)
        if fence is not None:
            fence.synchronize()
        return out

    def set_grads(self, owned_grads: list[torch.Tensor], multiplier: float) -> None:
        self.inner.set_grads(self.to_host(owned_grads), multiplier)

    # ---- figures ------------------------------------------------------------------------------
    def host_bytes(self) -> int:
        return sum(m.numel() * m.element_size() for i, m in enumerate(self.inner.masters) if i not in self.on_device)

    def state_bytes(self, optimizer: torch.optim.Optimizer) -> tuple[int, int]:
        """Bytes of masters and optimizer state ``(on the compute device, on the host)``."""
        sides = [0, 0]
        for i, m in enumerate(self.inner.masters):
            state = [v for v in optimizer.state.get(m, {}).values() if torch.is_tensor(v)]
            sides[i not in self.on_device] += sum(t.numel() * t.element_size() for t in [m.data, *state])
        return sides[0], sides[1]
