"""The engine takes its batch triple from an ``elasticity`` block at the world it starts at."""

from __future__ import annotations

import torch

import zerorun

ELASTIC = {"elasticity": {"enabled": True, "max_train_batch_size": 24, "micro_batch_sizes": [2, 4], "version": 0.1},
           "optimizer": {"type": "SGD", "params": {"lr": 0.1}}}


def test_the_engine_derives_accumulation_from_the_block() -> None:
    engine, *_ = zerorun.initialize(model=torch.nn.Linear(4, 2), config=ELASTIC)
    assert (engine.train_batch_size(), engine.train_micro_batch_size_per_gpu(),
            engine.gradient_accumulation_steps()) == (24, 4, 6)
