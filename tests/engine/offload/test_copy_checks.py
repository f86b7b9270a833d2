"""The deferred-copy stand-in (``ZERORUN_CHECK_COPIES=deferred``, zerorun.engine.offload.copy_checks).

No GPU here: the stand-in is what lets a missing wait on a ``non_blocking`` host<->device
copy fail a CPU test. Checked: a device->host copy lands only at its fence (poison until
then), a host source overwritten before its fence poisons the destination, a ring slot
reused before the copy that read it was waited for is refused, a destination that is a view is judged
by its own bytes (its neighbours in the buffer may be written), and (item 1 of the GPU
review) stage-3 NVMe parameter offload with ``pin_memory`` trains exactly under the stand-in:
it failed there while the gather's host->device copy bypassed the copier (the third fetch
overwrote ring slot 0 with nothing waiting for the first copy).
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.engine.test_engine_stage3_cases import MICRO_BATCH, global_batch, loss_fn, make_model
from zerorun.engine.errors import EngineError
from zerorun.engine.offload import copy_checks
from zerorun.engine.offload.copy_checks import CHECK_ENV, CopyRaceError, CopyStream, DeferredTransfers

ROOT = Path(__file__).resolve().parents[3]


def _transfers() -> DeferredTransfers:
    return DeferredTransfers(True, CopyStream())


def test_modes_are_parsed_and_unknown_ones_named() -> None:
    assert copy_checks.check_modes({CHECK_ENV: " Deferred "}) == {"deferred"}
    assert copy_checks.check_modes({}) == frozenset()
    with pytest.raises(EngineError, match="unknown mode.*eager"):
        copy_checks.check_modes({CHECK_ENV: "deferred,eager"})


def test_the_policy_hands_out_the_stand_in_only_in_the_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    from zerorun.engine.offload.policy import OffloadPolicy

    assert type(OffloadPolicy("cpu", pin_memory=True).transfers()).__name__ == "Transfers"
    monkeypatch.setenv(CHECK_ENV, "deferred")
    t = OffloadPolicy("cpu", pin_memory=True).transfers()
    assert isinstance(t, DeferredTransfers) and t.pins
    assert not OffloadPolicy("cpu", pin_memory=False).transfers().pins  # unpinned copies are blocking anyway


def test_a_copy_down_lands_only_when_its_fence_is_waited_for() -> None:
    t = _transfers()
    host = t.pinned(torch.zeros(3))
    device = torch.full((3,), 2.0)
    fence = t.copy(host, device)
    device.fill_(9.0)  # later device work on the source: the stream copied the value before it
    assert fence is not None and all(math.isnan(v) for v in host.tolist())  # a host read now reads poison
    fence.synchronize()
    assert host.tolist() == [2.0, 2.0, 2.0]


def test_a_copy_down_written_over_before_its_wait_is_an_error() -> None:
    t = _transfers()
    host = t.pinned(torch.zeros(2))
    t.copy(host, torch.ones(2))
    host.fill_(5.0)
    with pytest.raises(CopyRaceError, match="written before its fence"):
        t.wait()


def test_copies_down_into_views_of_one_buffer_tell_their_own_writes_from_a_neighbours() -> None:
    """Views share a version counter: a copy's destination is judged by its own bytes (the poison), so a
    write beside it (another bucket's sum in the same flat buffer) is no race, and one into it still is."""
    t = _transfers()
    flat = t.pinned(torch.zeros(4))
    left, right = flat[:2], flat[2:]
    t.copy(left, torch.ones(2))
    right.fill_(3.0)  # the neighbour
    t.wait()
    assert flat.tolist() == [1.0, 1.0, 3.0, 3.0]
    t.copy(left, torch.ones(2))
    left[1] = 5.0
    with pytest.raises(CopyRaceError, match="written before its fence"):
        t.wait()


def test_down_is_complete_on_return() -> None:
    t = _transfers()
    out = t.down([torch.arange(3.0)], torch.float32)
    assert out[0].tolist() == [0.0, 1.0, 2.0] and t.on_host(out[0]) and t.syncs == 1


def test_a_host_source_overwritten_before_its_fence_poisons_the_destination() -> None:
    t = _transfers()
    src = t.pinned(torch.ones(4))
    dst = torch.zeros(4)  # stands for a device buffer
    fence = t.copy(dst, src)
    assert dst.tolist() == [1.0] * 4  # the device work after it on the stream sees the copy
    src.fill_(7.0)
    with pytest.raises(CopyRaceError, match="overwritten before its fence"):
        fence.synchronize()
    assert all(math.isnan(v) for v in dst.tolist())


def test_a_ring_slot_is_reused_only_after_the_copy_that_read_it() -> None:
    t = _transfers()
    dsts = [torch.zeros(3) for _ in range(4)]
    for i, dst in enumerate(dsts):  # four fetches through two slots, each copied up through the copier
        t.copy(dst, t.staged(torch.full((3,), float(i))))
    assert [d.tolist() for d in dsts] == [[float(i)] * 3 for i in range(4)]
    t.wait()


def test_a_ring_slot_copied_by_a_bare_copy_is_refused_at_its_reuse() -> None:
    """What 9b6a4ae's gather did: ``dst.copy_(slot, non_blocking=True)`` outside the copier."""
    t = _transfers()
    for i in range(2):
        torch.zeros(3).copy_(t.staged(torch.full((3,), float(i))), non_blocking=True)
    with pytest.raises(CopyRaceError, match="no copy through Transfers.copy read it"):
        t.staged(torch.zeros(3))


def test_every_non_blocking_copy_goes_through_the_copier() -> None:
    """The stand-in sees only copies issued by Transfers: a bare ``non_blocking=True`` elsewhere
    in the engine would be a copy nothing waits for (what item 1 was)."""
    hits = [f"{p.relative_to(ROOT)}:{n}" for p in sorted((ROOT / "zerorun").rglob("*.py"))
            if p.name != "copies.py"
            for n, line in enumerate(p.read_text().splitlines(), 1) if re.search(r"non_blocking\s*=\s*True", line)]
    assert hits == [], hits


def _train_nvme_pinned(root: Path, steps: int, offload: bool) -> dict[str, Any]:
    import zerorun

    model = make_model("mlp")
    zero: dict[str, Any] = {"stage": 3, "stage3_param_persistence_threshold": 0, "stage3_prefetch_bucket_size": 10**9}
    if offload:
        zero["offload_param"] = {"device": "nvme", "nvme_path": str(root), "pin_memory": True, "buffer_count": 2}
    cfg = {"train_micro_batch_size_per_gpu": MICRO_BATCH, "gradient_clipping": 0.0, "zero_optimization": zero,
           "optimizer": {"type": "SGD", "params": {"lr": 5e-2}}}
    engine, _, _, _ = zerorun.initialize(model=model, config=cfg)
    losses = []
    for step in range(steps):
        x, y = global_batch("mlp", step, MICRO_BATCH)
        loss = loss_fn("mlp", engine(x), y)
        engine.backward(loss)
        engine.step()
        losses.append(float(loss.detach()))
    off = engine.parts.param_offload
    out = {"losses": losses, "buckets": len(engine.parts.buckets),
           "stand_in": isinstance(off.copies, DeferredTransfers) if off is not None else None}
    with zerorun.zero.GatheredParameters(list(model.parameters())):
        out["params"] = [p.detach().clone() for p in model.parameters()]
    if off is not None:
        off.close()
    return out


def test_nvme_parameter_offload_with_pinning_trains_exactly_under_the_stand_in(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ref = _train_nvme_pinned(tmp_path / "ref", 2, offload=False)
    monkeypatch.setenv(CHECK_ENV, "deferred")
    got = _train_nvme_pinned(tmp_path / "swap", 2, offload=True)
    assert got["stand_in"] and got["buckets"] >= 3  # more units than ring slots: slots are reused
    assert got["losses"] == ref["losses"]
    assert all(torch.equal(a, b) for a, b in zip(got["params"], ref["params"], strict=True))
