"""The offload copy discipline (zerorun.engine.offload.copies), checked on the CPU.

No GPU here, so CUDA is mocked: a fake ``torch.cuda`` (``is_available``, ``Event`` with
``record``/``synchronize``, logged) and two seams of :class:`Transfers`, ``on_host``
(which tensors stand for device tensors), ``_pin`` and ``_pinned_empty`` (pinning needs
CUDA; the fake marks the tensor). The copies themselves are real CPU copies, so values are checked too.
"""

from __future__ import annotations

import torch

from zerorun.engine.offload.copies import Transfers
from zerorun.engine.offload.policy import OffloadPolicy


class FakeCuda:
    def __init__(self, available: bool = True) -> None:
        self.available = available
        self.log: list[str] = []
        cuda = self

        class Event:
            def record(self) -> None:
                cuda.log.append("record")

            def synchronize(self) -> None:
                cuda.log.append("sync")

        self.Event = Event

    def is_available(self) -> bool:
        return self.available


class Mocked(Transfers):
    """Tensors in ``device`` stand for CUDA tensors; pinned ones are remembered by id."""

    def __init__(self, pin_memory: bool, cuda: FakeCuda) -> None:
        super().__init__(pin_memory, cuda)
        self.device: set[int] = set()
        self.pinned_ids: set[int] = set()

    def on_host(self, t: torch.Tensor) -> bool:
        return id(t) not in self.device

    def _pin(self, t: torch.Tensor) -> torch.Tensor:
        out = t.clone()
        self.pinned_ids.add(id(out))
        self.cuda.log.append("pin")
        return out

    def _pinned_empty(self, shape: torch.Size, dtype: torch.dtype) -> torch.Tensor:
        out = torch.empty(shape, dtype=dtype)
        self.pinned_ids.add(id(out))
        self.cuda.log.append("alloc pinned")
        return out

    def gpu(self, t: torch.Tensor) -> torch.Tensor:
        self.device.add(id(t))
        return t


def test_pinning_needs_both_the_policy_and_cuda() -> None:
    assert Transfers(True, FakeCuda(True)).pins
    assert not Transfers(True, FakeCuda(False)).pins and not Transfers(False, FakeCuda(True)).pins
    assert not OffloadPolicy("cpu", pin_memory=True).transfers().pins  # this machine has no CUDA


def test_down_copies_into_pinned_buffers_and_syncs_once_after_the_last() -> None:
    cuda = FakeCuda()
    t = Mocked(True, cuda)
    grads = [t.gpu(torch.arange(4.0, dtype=torch.bfloat16)), t.gpu(torch.ones(3)), torch.full((2,), 7.0)]
    out = t.down(grads, torch.float32)
    assert [o.dtype for o in out] == [torch.float32] * 3
    assert [o.tolist() for o in out] == [[0, 1, 2, 3], [1, 1, 1], [7, 7]]
    assert {id(out[0]), id(out[1])} <= t.pinned_ids and out[2] is grads[2]  # host ones pass through
    # allocated pinned (no pin_memory() copy of a fresh buffer); one wait, after every copy
    assert cuda.log == ["alloc pinned", "alloc pinned", "record", "sync"] and t.syncs == 1
    cuda.log.clear()
    t.down([torch.ones(2)])  # nothing on the device: no wait at all
    assert cuda.log == []


def test_down_without_pinning_still_waits_before_the_cpu_reads() -> None:
    cuda = FakeCuda()
    t = Mocked(False, cuda)
    out = t.down([t.gpu(torch.ones(2))])
    assert out[0].tolist() == [1, 1] and id(out[0]) not in t.pinned_ids
    assert cuda.log == ["record", "sync"]


def test_a_queued_copy_is_waited_for_once_before_the_host_side_is_used(monkeypatch) -> None:
    cuda = FakeCuda()
    t = Mocked(True, cuda)
    host = t.pinned(torch.zeros(3))
    monkeypatch.setattr(torch.Tensor, "is_pinned", lambda self: id(self) in t.pinned_ids)
    for v in (1.0, 2.0):  # two stepped shards copied down into the same pinned buffer
        t.copy(host, t.gpu(torch.full((3,), v)))
    assert host.tolist() == [2, 2, 2]
    assert cuda.log == ["pin", "record", "record"]  # queued: no host wait yet
    t.wait()
    t.wait()  # already settled
    assert cuda.log == ["pin", "record", "record", "sync"] and t.syncs == 1
    cuda.log.clear()
    t.copy(torch.zeros(2), torch.ones(2))  # host to host: a plain copy, nothing to wait for
    t.wait()
    assert cuda.log == []


def test_parameter_offload_waits_for_the_queued_shard_copy_at_the_end_of_the_step(monkeypatch) -> None:
    """ParamOffload (cpu) with pinning on: the stepped shard's copy down is queued, flush() waits."""
    from types import SimpleNamespace

    from zerorun.engine.offload.params import ParamOffload

    bucket = SimpleNamespace(persistent=False, local=torch.zeros(4), offload=None)
    off = ParamOffload(OffloadPolicy("cpu", pin_memory=True), [bucket])
    cuda = FakeCuda()
    off.copies = t = Mocked(True, cuda)
    bucket.local = t.pinned(bucket.local)
    monkeypatch.setattr(torch.Tensor, "is_pinned", lambda self: id(self) in t.pinned_ids)
    off.store(bucket, t.gpu(torch.full((4,), 5.0)))
    assert bucket.local.tolist() == [5.0] * 4 and cuda.log == ["pin", "record"]
    off.flush()
    assert cuda.log == ["pin", "record", "sync"]


def test_data_read_every_step_is_pinned_through_a_fixed_ring() -> None:
    """Swap-file reads staged step after step pin only ``slots`` buffers (pinning each read afresh
    would grow torch's caching host allocator with every step), and each staged copy is exact."""
    cuda = FakeCuda()
    t = Mocked(True, cuda)
    pins = []
    for step in range(5):
        for size in (8, 6, 8):
            read = torch.arange(size, dtype=torch.float32) + step
            out = t.staged(read)
            assert torch.equal(out, read) and out.dtype == read.dtype
        pins.append(cuda.log.count("alloc pinned"))
    assert pins[1] <= 3 and pins[1:] == [pins[1]] * 4, pins  # two slots, grown once to the largest read
    assert Transfers(True, FakeCuda(False)).staged(read) is read  # nothing to pin without CUDA


def test_a_gradient_chunk_goes_down_on_a_side_stream_after_the_current_ones_work() -> None:
    """side_down: the side stream waits for the current stream (the reduction's result), the copy and its
    event are on the side stream, the source is marked used there; order_after makes the current stream
    wait for that event (no host sync). Not pinned: a plain copy, complete on return."""
    import contextlib

    cuda = FakeCuda()
    current = "current"

    class Stream:
        def __init__(self, name: str = "side") -> None:
            self.name = name

        def wait_stream(self, other: object) -> None:
            cuda.log.append(f"{self.name} waits for {other}")

        def wait_event(self, event: object) -> None:
            cuda.log.append(f"{self.name} waits for an event")

        def __str__(self) -> str:
            return self.name

    @contextlib.contextmanager
    def stream(s: Stream):  # noqa: ANN202 - torch.cuda.stream's shape
        nonlocal current
        before, current = current, s.name
        cuda.log.append(f"on {s.name}")
        yield
        current = before

    cuda.Stream, cuda.stream = Stream, stream
    cuda.current_stream = lambda: Stream(current)
    t = Mocked(True, cuda)
    t.is_pinned = lambda x: id(x) in t.pinned_ids  # type: ignore[method-assign]
    issued: list[str] = []
    host = t.host_empty(3, torch.float32)
    src = t.gpu(torch.ones(3))
    recorded: list[str] = []
    src.record_stream = lambda s: recorded.append(s.name)  # type: ignore[method-assign]
    real_copy = torch.Tensor.copy_
    try:
        torch.Tensor.copy_ = lambda self, other, non_blocking=False: (  # type: ignore[method-assign]
            issued.append(f"{current} non_blocking={non_blocking}"), real_copy(self, other))[1]
        fence = t.side_down(host, src)
    finally:
        torch.Tensor.copy_ = real_copy  # type: ignore[method-assign]
    assert fence is not None and host.tolist() == [1, 1, 1]
    assert issued == ["side non_blocking=True"] and recorded == ["side"]
    assert cuda.log == ["alloc pinned", "side waits for current", "on side", "record"]
    t.order_after(fence)
    assert cuda.log[-1] == "current waits for an event" and t.syncs == 0
    plain = Mocked(False, FakeCuda())
    assert plain.side_down(torch.zeros(3), plain.gpu(torch.ones(3))) is None  # pageable: blocking, done
