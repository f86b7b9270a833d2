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


def test_global_samples_count_the_global_batch_and_survive_a_checkpoint(tmp_path) -> None:
    from torch.utils.data import TensorDataset

    config = {"train_batch_size": 4, "train_micro_batch_size_per_gpu": 2, "steps_per_print": 10**6,
              "optimizer": {"type": "SGD", "params": {"lr": 0.1}}}
    data = TensorDataset(torch.randn(16, 4), torch.randn(16, 2))

    def build():
        torch.manual_seed(0)
        return zerorun.initialize(model=torch.nn.Linear(4, 2), config=config, training_data=data)

    engine, _, loader, _ = build()
    for _, (x, y) in zip(range(6), loader, strict=False):  # 6 micro batches: 3 optimizer steps of 4 samples
        engine.backward(torch.nn.functional.mse_loss(engine(x), y))
        engine.step()
    assert (engine.global_steps, engine.global_samples) == (3, 12)
    engine.save_checkpoint(str(tmp_path))
    again, _, loader2, _ = build()
    again.load_checkpoint(str(tmp_path))
    assert (again.global_steps, again.global_samples) == (3, 12)
    assert loader2.state_dict()["samples"] == again.global_samples  # one epoch: the loader's position is the same


def test_a_resume_at_another_accumulation_rebases_the_micro_steps() -> None:
    from zerorun.engine.checkpoint.state import rebased_micro_steps

    saved = {"global_steps": 2, "micro_steps": 4}  # world 3, accumulation 2
    assert rebased_micro_steps(saved, {"gradient_accumulation_steps": 2}, 3) == 6  # world 2: boundary after 3 more
    assert rebased_micro_steps(saved, {"gradient_accumulation_steps": 2}, 2) == 4
    assert rebased_micro_steps({"global_steps": 2, "micro_steps": 5}, {"gradient_accumulation_steps": 2}, 3) == 7
    assert rebased_micro_steps(saved, {}, 3) == 4  # a checkpoint without the batch facts: as saved
