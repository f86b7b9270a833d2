"""``optimizer.bit16_groups_flat`` and the flatten log line at ZeRO stages 1 and 2
(zerorun.engine.surface.flat_groups), as DeepSpeed 0.19.8's ZeRO-1/2 optimizer has them.

One engine of one rank in this process per case: the list holds one flat buffer per bucket, detached,
on the engine's device, in the compute dtype, and every trainable parameter is a view of one of them
(a write into the buffer is a write into the parameter); it reads the live buckets (a bucket whose
tensor is replaced shows the new one); the line ``Flattening param group N on cpu (sufficient memory)``
goes once per parameter group, at INFO, through ``deepspeed.utils.logger.info`` looked up at the call
(replaced here as DeepSpeed's own test replaces it); training steps after. Stages 0 and 3 have neither.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
import torch
from torch import nn

import zerorun
from zerorun.compat import utils as ds_utils


def _engine(stage: int, bf16: bool) -> Any:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    groups = [{"params": list(model[0].parameters())}, {"params": list(model[2].parameters()), "lr": 1e-3}]
    cfg: dict[str, Any] = {"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": stage}}
    if bf16:
        cfg["bf16"] = {"enabled": True}
    engine, *_ = zerorun.initialize(model=model, optimizer=torch.optim.Adam(groups, lr=1e-2), config=cfg)
    return engine


def _captured(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    lines: list[str] = []
    monkeypatch.setattr(ds_utils.logger, "info", lambda msg, *a, **k: lines.append(str(msg)))
    return lines


@pytest.mark.parametrize("stage,bf16", [(1, False), (2, True)], ids=["stage1-fp32", "stage2-bf16"])
def test_the_flat_buffers_are_the_parameters_storage(world_of_one: None, monkeypatch: pytest.MonkeyPatch,
                                                     stage: int, bf16: bool) -> None:
    lines = _captured(monkeypatch)
    engine = _engine(stage, bf16)
    flats = engine.optimizer.bit16_groups_flat
    buckets = engine.parts.buckets
    assert len(flats) == len(buckets) >= 2 and all(f is b.data for f, b in zip(flats, buckets, strict=True))
    dtype = torch.bfloat16 if bf16 else torch.float32
    for f in flats:
        assert f.grad_fn is None and not f.requires_grad and f.device == engine.device and f.dtype == dtype
    for p in engine.module.parameters():  # each parameter's storage lies inside exactly one buffer
        inside = [f for f in flats if f.data_ptr() <= p.data_ptr() < f.data_ptr() + f.numel() * f.element_size()]
        assert len(inside) == 1 and p.dtype == dtype
    with torch.no_grad():
        flats[0].fill_(0.5)  # a write into the buffer is a write into its parameters
    assert all(bool((p == 0.5).all()) for p in buckets[0].params)
    assert [m for m in lines if "Flattening param group" in m and "(sufficient memory)" in m] == lines
    assert [m.split(" on ")[0] for m in lines] == ["Flattening param group 0", "Flattening param group 1"]
    assert all(" on cpu (sufficient memory)" in m for m in lines)
    x, y = torch.randn(2, 8), torch.randn(2, 4)
    for _ in range(2):  # the optimizer steps through the flat buffers (no in-place error on a view)
        engine.backward(nn.functional.mse_loss(engine(x.to(dtype)).float(), y))
        engine.step()
    assert all(bool(f.isfinite().all()) for f in flats) and not bool((buckets[0].params[0] == 0.5).all())


def test_the_list_reads_the_live_buckets(world_of_one: None) -> None:
    engine = _engine(2, False)
    b = engine.parts.buckets[0]
    b.data = b.data.clone()  # what offload_states / reload_states do on a GPU: a new tensor, the views re-bound
    b.bind()
    assert engine.optimizer.bit16_groups_flat[0] is b.data
    assert b.params[0].data_ptr() == b.data.data_ptr() + b.plan.slots[0].offset * b.data.element_size()


def test_the_line_is_info_on_deepspeeds_logger(world_of_one: None) -> None:
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    keep, level = Keep(level=logging.DEBUG), ds_utils.logger.level
    ds_utils.logger.addHandler(keep)
    ds_utils.logger.setLevel(logging.DEBUG)
    try:
        _engine(1, True)
    finally:
        ds_utils.logger.removeHandler(keep)
        ds_utils.logger.setLevel(level)
    flat = [r for r in records if "Flattening param group" in r.getMessage()]
    assert len(flat) == 2 and {r.levelno for r in flat} == {logging.INFO}


@pytest.mark.parametrize("stage", [0, 3])
def test_stages_0_and_3_have_none(world_of_one: None, monkeypatch: pytest.MonkeyPatch, stage: int) -> None:
    lines = _captured(monkeypatch)
    engine = _engine(stage, False)
    assert not hasattr(engine.optimizer, "bit16_groups_flat")
    assert not [m for m in lines if "Flattening param group" in m]


def _rank_chunks(rank: int, world: int) -> list[tuple[int, int, bool]]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 7), nn.ReLU(), nn.Linear(7, 3))  # odd sizes: padding decides the starts
    cfg = {"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 2}, "bf16": {"enabled": True}}
    engine, opt, *_ = zerorun.initialize(model=model, optimizer=torch.optim.Adam(model.parameters()), config=cfg)
    out = []
    for flat, chunks in zip(opt.bit16_groups_flat, opt.parallel_partitioned_bit16_groups, strict=True):
        starts_aligned = all(c.data_ptr() % (2 * opt.nccl_start_alignment_factor) == 0 for c in chunks)
        out.append((len(chunks), sum(c.numel() for c in chunks) - flat.numel(),
                    starts_aligned and torch.equal(torch.cat(chunks), flat)
                    ))
    engine.destroy()
    return out


def test_every_ranks_chunk_starts_aligned() -> None:
    """``parallel_partitioned_bit16_groups``: per bucket, each rank's chunk of the flat buffer, in rank order, every
    one starting at ``2 * nccl_start_alignment_factor`` bytes (DeepSpeed's check; zerorun aligns to 16)."""
    from tests.dist_harness import run_distributed

    for per_rank in run_distributed(_rank_chunks, 2, timeout=240):
        assert per_rank and all(n == 2 and extra == 0 and ok for n, extra, ok in per_rank), per_rank
