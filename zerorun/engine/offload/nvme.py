"""Optimizer offload to swap files (``offload_optimizer.device: nvme``).

Between optimizer steps no master or optimizer-state bytes stay in memory: each master
shard and each state tensor of its size (Adam's ``exp_avg``/``exp_avg_sq``, SGD's
momentum) lives in a swap file; the scalars (Adam's ``step``) stay. For the step (and
for checkpoint save/load) everything is read back by the swapper's ``buffer_count``
threads in parallel, the host step runs (see :mod:`host`), and everything is written
out again in parallel and released. In the step itself the reads and writes join the
host step's pipeline over chunks: chunk k+1 is read while chunk k steps, and chunk k is
written out (and released) while chunk k+1 steps, so the working set is about three
chunks, not the whole shard (DeepSpeed's ``pipeline_read``/``pipeline_write``, always on).
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
from zerorun.engine.offload.swapper import Swapper, release_freed_memory

if TYPE_CHECKING:
    from zerorun.engine.mechanism.masters import MasterShards


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
        self._reading: set[int] = set()
        self.swap_out()

    def _wait(self, futures: list[Future[Any]]) -> list[Any]:
        try:
            return [f.result() for f in futures]
        except BaseException:
            self.swapper.close()  # a failed swap leaves no files behind
            raise

    def _swapped(self) -> list[int]:
        return [i for i in range(len(self.numels)) if i not in self.on_device]  # Twin-Flow's stay on the device

    def swap_out(self, buckets: list[int] | None = None, wait: bool = True) -> list[Future[None]]:
        """Write the masters and state shards of ``buckets`` (default: all) to their files and drop them
        (a write holds its tensor until it is written); ``wait``: until the files are complete."""
        futures: list[Future[None]] = []
        for i in self._swapped() if buckets is None else [i for i in buckets if i not in self.on_device]:
            m = self.inner.masters[i]
            if m.data.numel() != self.numels[i]:
                continue  # not in memory
            state = self.optimizer.state.get(m, {})
            self.keys[i] = [k for k, v in state.items() if _is_shard(v, self.numels[i])]
            futures.append(self.swapper.write(f"b{i}.master", m.data))
            futures.extend(self.swapper.write(f"b{i}.{k}", state[k]) for k in self.keys[i])
            m.data = torch.empty(0, device="cpu")
            self._bind_bucket(i)
            for k in self.keys[i]:
                state[k] = torch.empty(0, dtype=state[k].dtype, device="cpu")
        if wait:
            self._wait(futures)
            if buckets is None:
                self.is_resident = False
                release_freed_memory()
        return futures

    def read_in(self, buckets: list[int]) -> list[tuple[int, str | None, Future[torch.Tensor]]]:
        """Queue the reads of ``buckets``' masters and state shards (``buffer_count`` in flight)."""
        jobs: list[tuple[int, str | None, Future[torch.Tensor]]] = []
        for i in [i for i in buckets if i not in self.on_device]:
            m = self.inner.masters[i]
            if m.data.numel() == self.numels[i] or i in self._reading:
                continue  # in memory, or already on its way
            self._reading.add(i)
            jobs.append((i, None, self.swapper.read(f"b{i}.master", self.numels[i], self.master_dtype)))
            state = self.optimizer.state.get(m, {})
            jobs.extend((i, k, self.swapper.read(f"b{i}.{k}", self.numels[i], state[k].dtype)) for k in self.keys[i])
        return jobs

    def install(self, jobs: list[tuple[int, str | None, Future[torch.Tensor]]]) -> None:
        """Wait for queued reads and put the tensors in place."""
        tensors = self._wait([f for _, _, f in jobs])
        for (i, key, _), t in zip(jobs, tensors, strict=True):
            m = self.inner.masters[i]
            # not pinned: the CPU steps these, and a pinned copy would stay in torch's caching host
            # allocator between steps (which NVMe offload exists to avoid); publish copies up synchronously
            if key is None:
                m.data = t
                self._bind_bucket(i)
            else:
                self.optimizer.state[m][key] = t
            self._reading.discard(i)

    def _bind_bucket(self, i: int) -> None:
        """A stage-3 bucket's handle on its master follows the master in and out: a handle kept on a
        swapped-out master held its bytes in memory (and a gathered edit went to that stale copy)."""
        b = self.inner.buckets[i]
        if hasattr(b, "master"):
            m = self.inner.masters[i]
            b.master = m.data if m.data.numel() == self.numels[i] else None

    def swap_in(self) -> None:
        """Read every master and state shard back (``buffer_count`` reads in flight)."""
        if self.is_resident:
            return
        self.install(self.read_in(self._swapped()))
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
        if self.is_resident:  # read in already (a checkpoint's resident()): step, leave it so
            super().step(optimizer, owned_grads, multiplier, coll)
            return
        self._jobs: dict[int, list[tuple[int, str | None, Future[torch.Tensor]]]] = {}
        self._writes: list[Future[None]] = []
        chunks = self.inner.step_chunks()
        for i in chunks[0] if chunks else []:
            self._jobs[i] = self.read_in([i])
        try:
            super().step(optimizer, owned_grads, multiplier, coll)
        finally:
            self._wait(self._writes)
            self._writes = []
        release_freed_memory()

    def before_chunk(self, chunk: list[int], following: list[int] | None) -> None:
        if self.is_resident:
            return
        jobs = [j for i in chunk for j in self._jobs.pop(i, [])]
        if following is not None:  # chunk k+1 is read while chunk k steps
            for i in following:
                self._jobs[i] = self.read_in([i])
        for i in chunk:
            jobs.extend(self.read_in([i]))  # not queued before (the first chunk is)
        self.install(jobs)

    def after_chunk(self, chunk: list[int]) -> None:
        if not self.is_resident:  # written out while the next chunk steps
            self._writes.extend(self.swap_out(chunk, wait=False))

    # the engine's older step sequence: set_grads -> optimizer.step -> clear_grads -> publish
    def set_grads(self, owned_grads: list[torch.Tensor], multiplier: float) -> None:
        self.swap_in()
        super().set_grads(owned_grads, multiplier)

    def publish(self, coll: Collectives) -> None:
        self.inner.publish(coll)
        self.swap_out()

    def close(self) -> None:
        self.swapper.close()
