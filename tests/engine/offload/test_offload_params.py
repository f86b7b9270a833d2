"""Parameter offload at stage 3 (``offload_param`` cpu, nvme) trains exactly as stage 3 without it.

This machine has no GPU, so the compute device is the CPU: with ``cpu`` the resting shard
is a host tensor and the copies to and from the compute device are same-device no-ops;
the path (fetch before the all-gather, ``non_blocking`` copy, shard written back after the
step) runs here, but pinned memory and real host<->GPU copies run only on a GPU. With
``nvme`` the shards really go through swap files (a tmp dir). Parity is exact
(``torch.equal`` and equal loss floats): offload changes where the shard rests, not what
the step computes. Cases are the stage-3 test models (tests/engine/test_engine_stage3_cases.py):
the MLP with the recorded prefetch on (which issues the reads ahead), the tied-embedding
GPT with gradient accumulation gathering on demand, and the MLP in bf16.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.dist_harness import run_distributed
from tests.engine.test_engine_cases import rank_rows
from tests.engine.test_engine_stage3_cases import (
    MICRO_BATCH,
    Case,
    before_step,
    global_batch,
    loss_fn,
    make_model,
)
from zerorun.engine.errors import EngineError

STEPS = 5
PLACEMENTS = ("none", "cpu", "nvme")
CASES = [Case("mlp", "fp32", 1, prefetch=True, persist=False),
         Case("gpt", "fp32", 3, prefetch=False, persist=False, sgd=True),
         Case("mlp", "bf16", 1, prefetch=True, persist=False, sgd=True)]


def _floats_in(engine: object, x: torch.Tensor) -> torch.Tensor:
    """Floating inputs in the compute dtype (the engine casts none); token ids stay as they are."""
    return x.to(engine.precision.compute_dtype) if x.is_floating_point() else x  # type: ignore[attr-defined]


def _config(case: Case, kind: str, root: str) -> dict[str, Any]:
    cfg = case.config()
    if kind == "cpu":
        cfg["zero_optimization"]["offload_param"] = {"device": "cpu", "pin_memory": True}
    elif kind == "nvme":
        cfg["zero_optimization"]["offload_param"] = {"device": "nvme", "nvme_path": root, "buffer_count": 2}
    elif kind == "nvme-deferred":  # pinned: the ring of staged reads, under the deferred-copy stand-in
        cfg["zero_optimization"]["offload_param"] = {"device": "nvme", "nvme_path": root, "buffer_count": 2,
                                                     "pin_memory": True}
        cfg["zero_optimization"]["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
        # the reference's kernel (a host step is fused by default): the comparison with it stays exact
        cfg["optimizer"]["params"]["foreach"] = True
    return cfg


def _train(case: Case, kind: str, rank: int, world: int, root: str) -> dict[str, Any]:
    import zerorun

    model = make_model(case.model)
    engine, _, _, _ = zerorun.initialize(model=model, config=_config(case, kind, root))
    off = engine.parts.param_offload
    rows = MICRO_BATCH * world * case.gas
    losses, resident = [], []
    for step in range(STEPS):
        before_step(case.model, model, step)
        x, y = global_batch(case.model, step, rows)
        for k in range(case.gas):
            loss = loss_fn(case.model, engine(_floats_in(engine, x[rank_rows(k, rank, world)])), y[rank_rows(k, rank, world)])
            engine.backward(loss)
            engine.step()
            losses.append(float(loss.detach()))
        resident.append(off.resident_bytes() if off is not None else None)
    out: dict[str, Any] = {"losses": losses, "memory": engine.memory_breakdown(), "resident": resident,
                           "states": sorted({b.state.value for b in engine.parts.buckets})}
    with zerorun.zero.GatheredParameters(list(model.parameters())):
        out["params"] = [p.detach().float().clone() for p in model.parameters()]
    if kind == "nvme":
        assert off is not None and off.swapper is not None
        swap = Path(off.swapper.dir)
        out["swap_files"] = sorted(p.name for p in swap.iterdir())
        out["read_aheads"] = off.read_aheads
        out["n_buckets"] = len(engine.parts.buckets)
        out["ckpt_equal"] = _checkpoint_round_trip(case, engine, out["params"], root,
                                                 os.path.join(os.path.dirname(root), f"ckpt-{case.name}"))
        # an edit under GatheredParameters(modifier_rank=0) lands in the swapped shard on every rank
        first = next(model.parameters())
        with zerorun.zero.GatheredParameters([first], modifier_rank=0):
            if rank == 0:
                first.data.fill_(0.5)
        with zerorun.zero.GatheredParameters([first]):
            out["edit_landed"] = bool((first == 0.5).all())
        out["resident_after_edit"] = off.resident_bytes()
        off.close()
        out["swap_exists_after_close"] = swap.exists()
    return out


def _checkpoint_round_trip(case: Case, engine: Any, params: list[torch.Tensor], root: str, ckpt: str
                           ) -> list[bool]:
    """Save from the offloaded engine; load into a fresh one without and one with nvme offload."""
    import zerorun

    engine.save_checkpoint(ckpt)
    equal = []
    for kind in ("none", "nvme"):
        model = make_model(case.model, seed=99)
        other, _, _, _ = zerorun.initialize(model=model, config=_config(case, kind, root + "-load"))
        other.load_checkpoint(ckpt)
        with zerorun.zero.GatheredParameters(list(model.parameters())):
            equal.append(all(torch.equal(p.detach().float(), q) for p, q in zip(model.parameters(), params,
                                                                                   strict=True)))
        if other.parts.param_offload is not None:
            equal.append(other.parts.param_offload.resident_bytes() == 0)
            other.parts.param_offload.close()
    return equal


def _deferred(case: Case, rank: int, world: int, root: str) -> dict[str, Any]:
    """The first case with pinned nvme parameters and cpu optimizer offload under the deferred-copy
    stand-in (zerorun.engine.offload.copy_checks): a copy nothing waits for fails it."""
    import zerorun
    from zerorun.engine.offload.copy_checks import CHECK_ENV, DeferredTransfers

    os.environ[CHECK_ENV] = "deferred"
    try:
        model = make_model(case.model)
        engine, _, _, _ = zerorun.initialize(model=model, config=_config(case, "nvme-deferred", root))
        losses = []
        for step in range(STEPS):
            x, y = global_batch(case.model, step, MICRO_BATCH * world)
            loss = loss_fn(case.model, engine(_floats_in(engine, x[rank_rows(0, rank, world)])), y[rank_rows(0, rank, world)])
            engine.backward(loss)
            engine.step()
            losses.append(float(loss.detach()))
        off = engine.parts.param_offload
        with zerorun.zero.GatheredParameters(list(model.parameters())):
            params = [p.detach().float().clone() for p in model.parameters()]
        out = {"losses": losses, "params": params, "stand_in": isinstance(off.copies, DeferredTransfers),
               "buckets": len(engine.parts.buckets)}
        off.close()
        return out
    finally:
        del os.environ[CHECK_ENV]


def _all(rank: int, world: int, root: str) -> dict[str, Any]:
    out = {f"{case.name}/{kind}": _train(case, kind, rank, world, os.path.join(root, f"swap{rank}"))
           for case in CASES for kind in PLACEMENTS}
    out["deferred"] = _deferred(CASES[0], rank, world, os.path.join(root, f"swap{rank}-deferred"))
    return out


@pytest.fixture(scope="module")
def runs() -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory() as root:
        out = run_distributed(_all, 2, root, timeout=180)
        out.append({"left_in_root": sorted(str(p) for p in Path(root).rglob("*"))})
        return out


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
@pytest.mark.parametrize("kind", ["cpu", "nvme"])
def test_param_offload_trains_exactly_as_stage3(runs: list[dict[str, Any]], case: Case, kind: str) -> None:
    for rank, r in enumerate(runs[:2]):
        ref, got = r[f"{case.name}/none"], r[f"{case.name}/{kind}"]
        assert len(got["losses"]) == STEPS * case.gas
        assert got["losses"] == ref["losses"], f"[rank {rank}] {case.name} {kind}"
        for i, (a, b) in enumerate(zip(got["params"], ref["params"], strict=True)):
            assert torch.equal(a, b), f"[rank {rank}] {case.name} {kind}: parameter {i}"
        assert got["states"] == ["sharded"]


def test_pinned_nvme_offload_trains_exactly_under_the_deferred_copy_stand_in(runs: list[dict[str, Any]]) -> None:
    for rank, r in enumerate(runs[:2]):
        ref, got = r[f"{CASES[0].name}/none"], r["deferred"]
        assert got["stand_in"] and got["buckets"] > 2  # more units than ring slots: every slot is reused
        assert got["losses"] == ref["losses"], f"[rank {rank}]"
        for i, (a, b) in enumerate(zip(got["params"], ref["params"], strict=True)):
            assert torch.equal(a, b), f"[rank {rank}] parameter {i}"


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_nvme_keeps_no_parameter_shard_in_memory(runs: list[dict[str, Any]], case: Case) -> None:
    for r in runs[:2]:
        none, cpu, nvme = (r[f"{case.name}/{k}"] for k in PLACEMENTS)
        assert nvme["resident"] == [0] * STEPS  # after every step
        assert nvme["memory"]["params"] == 0 < none["memory"]["params"]
        # cpu: the shard rests in host memory, the same bytes as on the device without offload
        assert cpu["resident"] == [none["memory"]["params"]] * STEPS
        assert cpu["memory"]["params"] == none["memory"]["params"]
        assert nvme["swap_files"] == sorted(f"p{i}" for i in range(nvme["n_buckets"]))
        if case.prefetch:
            assert nvme["read_aheads"] > 0, "prefetch on, yet no shard was read ahead"
        else:
            assert nvme["read_aheads"] == 0
        assert nvme["ckpt_equal"] == [True, True, True], "a checkpoint of offloaded shards loads exactly"
        assert nvme["edit_landed"] and nvme["resident_after_edit"] == 0
        assert not nvme["swap_exists_after_close"]
    left = [p for p in runs[2]["left_in_root"] if "zerorun-swap" in p]
    assert left == [], left


def test_unwritable_nvme_path_fails_before_training(tmp_path: Path) -> None:
    import zerorun

    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(EngineError) as e:  # initialize re-raises it with the rank prefix
        zerorun.initialize(model=make_model("mlp"), config=_config(CASES[0], "nvme", str(blocker / "swap")))
    assert "zero_optimization.offload_param.nvme_path" in e.value.message
    assert "is not a writable directory" in e.value.message and "nvme_path" in e.value.hint
