"""Optimizer offload to host memory (``offload_optimizer.device: cpu``), stages 1-3.

Wraps the stage's master shards (built non-aliased, so each is a separate fp32 copy)
and moves every master to host memory; the optimizer then steps there (torch's CPU
kernels: foreach, or fused for Adam/AdamW when the optimizer asks for it). At the step:
the reduced gradient shards are copied down (:class:`~zerorun.engine.offload.copies.Transfers`:
into pinned buffers, ``non_blocking``, one event sync before the CPU step reads them), the
wrapped masters step, and their publish copies the updated masters up into the compute
parameters (a cross-device ``copy_``, cast to the compute dtype) before the all-gather.
With a CPU compute device (this project's tests) every copy is a no-op on the same
device, so the path runs but moves nothing; the GPU copies are exercised only on a GPU.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from zerorun.engine.comm.collectives import Collectives
from zerorun.engine.offload import copy_checks
from zerorun.engine.offload.policy import OffloadPolicy

if TYPE_CHECKING:
    from zerorun.engine.mechanism.masters import MasterShards


class HostMasters:
    """The wrapped masters with their data in host memory; anything not overridden is delegated."""

    def __init__(self, inner: MasterShards, policy: OffloadPolicy) -> None:
        assert not inner.alias, "offloaded masters must be separate copies (build them with alias=False)"
        self.inner = inner
        self.policy = policy
        self.copies = policy.transfers()
        # nvme writes the masters to files and frees them: pinned, torch's host cache would keep them
        home = self.copies if policy.device == "cpu" else copy_checks.transfers(False)
        for b, m in zip(inner.buckets, inner.masters, strict=True):
            if home.on_host(m.data) and m.dtype == torch.float32:
                m.data = home.pinned(m.data)  # taken on the host already (stages 0-2's set-up)
            else:
                m.data = home.host_copy(m.data, torch.float32)
            if getattr(b, "master", None) is not None:  # stage 3 buckets keep a handle on their master
                b.master = m.data

    def __getattr__(self, name: str) -> Any:  # the wrapped masters' attribute, whatever it is
        return getattr(self.inner, name)

    def to_host(self, grads: list[torch.Tensor]) -> list[torch.Tensor]:
        """Gradient shards as fp32 host tensors (the same tensors when they are already there),
        complete: the CPU step reads them next."""
        self.copies.wait()  # nothing queued may still touch the masters the CPU is about to step
        return self.copies.down(grads, torch.float32)

    def step(self, optimizer: torch.optim.Optimizer, owned_grads: list[torch.Tensor], multiplier: float,
             coll: Collectives) -> None:
        self.inner.step(optimizer, self.to_host(owned_grads), multiplier, coll)

    def set_grads(self, owned_grads: list[torch.Tensor], multiplier: float) -> None:
        self.inner.set_grads(self.to_host(owned_grads), multiplier)

    def host_bytes(self) -> int:
        return sum(m.numel() * m.element_size() for m in self.inner.masters)
