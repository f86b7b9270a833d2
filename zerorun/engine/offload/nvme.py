"""Optimizer offload to swap files (``offload_optimizer.device: nvme``).

Between optimizer steps no master or optimizer-state bytes stay in memory: each master
shard and each state tensor of its size (Adam's ``exp_avg``/``exp_avg_sq``, SGD's
momentum) lives in a swap file; the scalars (Adam's ``step``) stay. For the step (and
for checkpoint save/load) everything is read back by the swapper's ``buffer_count``
threads in parallel, the host step runs (see :mod:`host`), and everything is written
out again in parallel and released. The working set during the step is therefore the
whole shard (DeepSpeed bounds it with ``sub_group_size``; not done here).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

import torch

from zerorun.engine.comm.collectives import Collectives
from zerorun.engine.offload.host import HostMasters
from zerorun.engine.offload.policy import OffloadPolicy
from zerorun.engine.offload.swapper import Swapper
from zerorun.engine.physical_memory import trim_heap

if TYPE_CHECKING:
    from zerorun.engine.mechanism.masters import MasterShards


def release_freed_memory() -> None:
    """Hand the just-freed swap buffers back to the OS.

    Buffers read by the pool threads come from per-thread malloc arenas (glibc raises its
    mmap threshold after the first free), so without a trim the process keeps them mapped
    and the resident set never shrinks between steps.
    """
    trim_heap()


_STATES_PER_PARAM = {"adam": 2, "adamw": 2, "sgd": 1, "adagrad": 1, "rmsprop": 2}  # for the space check


def swap_bytes(masters: MasterShards, optimizer: torch.optim.Optimizer) -> int:
    """Bytes of swap this rank needs: the fp32 masters and each optimizer-state tensor of their size."""
    states = _STATES_PER_PARAM.get(type(optimizer).__name__.lower(), 2)
    return sum(m.numel() * 4 for m in masters.masters) * (1 + states)


def _is_shard(v: object, numel: int) -> bool:
    return torch.is_tensor(v) and v.numel() == numel and numel > 1


class NvmeMasters(HostMasters):
    def __init__(self, inner: MasterShards, policy: OffloadPolicy, optimizer: torch.optim.Optimizer) -> None:
        super().__init__(inner, policy)
        assert policy.nvme_path is not None
        self.optimizer = optimizer
        self.swapper = Swapper(policy.nvme_path, policy.buffer_count, swap_bytes(inner, optimizer))
        self.numels = [m.numel() for m in inner.masters]
        self.keys: list[list[str]] = [[] for _ in inner.masters]  # swapped optimizer-state keys per bucket
        self.is_resident = True
        self.swap_out()

    def _wait(self, futures: list[Future[Any]]) -> list[Any]:
        try:
            return [f.result() for f in futures]
        except BaseException:
            self.swapper.close()  # a failed swap leaves no files behind
            raise

    def swap_out(self) -> None:
        """Write every master and state shard to its file, then release the memory."""
        if not self.is_resident:
            return
        futures = []
        for i, m in enumerate(self.inner.masters):
            state = self.optimizer.state.get(m, {})
            self.keys[i] = [k for k, v in state.items() if _is_shard(v, self.numels[i])]
            futures.append(self.swapper.write(f"b{i}.master", m.data))
            futures.extend(self.swapper.write(f"b{i}.{k}", state[k]) for k in self.keys[i])
        self._wait(futures)
        for i, m in enumerate(self.inner.masters):
            m.data = torch.empty(0, device="cpu")
            state = self.optimizer.state.get(m, {})
            for k in self.keys[i]:
                state[k] = torch.empty(0, dtype=state[k].dtype, device="cpu")
        self.is_resident = False
        release_freed_memory()

    def swap_in(self) -> None:
        """Read every master and state shard back (``buffer_count`` reads in flight)."""
        if self.is_resident:
            return
        jobs: list[tuple[int, str | None, Future[torch.Tensor]]] = []
        for i, m in enumerate(self.inner.masters):
            jobs.append((i, None, self.swapper.read(f"b{i}.master", self.numels[i], torch.float32)))
            state = self.optimizer.state.get(m, {})
            jobs.extend((i, k, self.swapper.read(f"b{i}.{k}", self.numels[i], state[k].dtype)) for k in self.keys[i])
        tensors = self._wait([f for _, _, f in jobs])
        for (i, key, _), t in zip(jobs, tensors, strict=True):
            m = self.inner.masters[i]
            # not pinned: the CPU steps these, and a pinned copy would stay in torch's caching host
            # allocator between steps (which NVMe offload exists to avoid); publish copies up synchronously
            if key is None:
                m.data = t
            else:
                self.optimizer.state[m][key] = t
        self.is_resident = True

    @contextlib.contextmanager
    def resident(self) -> Iterator[None]:
        self.swap_in()
        try:
            yield
        finally:
            self.swap_out()

    def step(self, optimizer: torch.optim.Optimizer, owned_grads: list[torch.Tensor], multiplier: float,
             coll: Collectives) -> None:
        with self.resident():
            super().step(optimizer, owned_grads, multiplier, coll)

    # the engine's older step sequence: set_grads -> optimizer.step -> clear_grads -> publish
    def set_grads(self, owned_grads: list[torch.Tensor], multiplier: float) -> None:
        self.swap_in()
        super().set_grads(owned_grads, multiplier)

    def publish(self, coll: Collectives) -> None:
        self.inner.publish(coll)
        self.swap_out()

    def close(self) -> None:
        self.swapper.close()
