"""Stage 2's staging pool reuses a finished reduction's buffer before it grows.

With DeepSpeed's default ``reduce_bucket_size`` (5e8) the pool may grow to four buckets
while backward outruns the reductions; a reduction that is already over (here every one:
world size 1 issues none) must hand its buffer back instead, so the pool stays at one
bucket, the stage's floor.
"""

from __future__ import annotations

import torch
from torch import nn

import zerorun


def test_stage_2_stages_one_bucket_when_every_reduction_is_over() -> None:
    torch.manual_seed(0)
    # three weights of 2^21 elements: three buckets of the gloo layout (2^21 elements at most)
    model = nn.Sequential(*[nn.Linear(1024, 2048, bias=False), nn.Linear(2048, 1024, bias=False),
                            nn.Linear(1024, 2048, bias=False)])
    cfg = {"train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "SGD", "params": {"lr": 1e-3}},
           "zero_optimization": {"stage": 2, "overlap_comm": False}}
    engine, *_ = zerorun.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    buckets = engine.parts.buckets
    assert len(buckets) == 3, [b.plan.padded_numel for b in buckets]
    for _ in range(2):
        engine.backward(engine(torch.randn(2, 1024)).square().mean())
        engine.step()
    one_bucket = max(b.plan.padded_numel for b in buckets) * 4
    assert engine.memory_breakdown()["buffers"] == one_bucket  # before: one per bucket (three)
