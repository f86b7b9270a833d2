"""The data position of the ``initialize(training_data=...)`` loader (no process group needed).

A pass interrupted after k micro batches, saved with ``state_dict`` and loaded into a
fresh loader, continues with exactly the batches the uninterrupted pass would have
given next - at the same world size, and at another world size that divides the
position. Another epoch than the saved one starts at its beginning.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import TensorDataset

from zerorun.engine.errors import EngineError
from zerorun.engine.training.dataloader import build_dataloader

DATA = TensorDataset(torch.arange(48).float())


def _ids(batches: list[list[torch.Tensor]]) -> list[list[int]]:
    return [b[0].long().tolist() for b in batches]


def _pass(world: int, rank: int, epoch: int, mb: int = 2) -> list[list[int]]:
    loader = build_dataloader(DATA, mb, rank, world)
    loader.set_epoch(epoch)
    return _ids(list(loader))


@pytest.mark.parametrize("epoch", [0, 3])
def test_resume_continues_at_the_next_micro_batch(epoch: int) -> None:
    for rank in range(3):
        straight = _pass(3, rank, epoch)
        first = build_dataloader(DATA, 2, rank, 3)
        first.set_epoch(epoch)
        it = iter(first)
        head = _ids([next(it) for _ in range(5)])
        state = first.state_dict()
        assert state == {"epoch": epoch, "samples": 30, "seed": 0, "world_size": 3, "micro_batch_size": 2}
        again = build_dataloader(DATA, 2, rank, 3)
        again.load_state_dict(state)
        assert again.epoch == epoch and again.batches_done == 5
        tail = _ids(list(again))
        assert head + tail == straight and len(straight) == 8
        assert again.batches_done == 8 and _ids(list(again)) == straight  # the skip is one-shot


def test_resume_at_another_world_size_reads_the_remaining_samples() -> None:
    before = build_dataloader(DATA, 2, 0, 2)
    it = iter(before)
    for _ in range(3):
        next(it)
    state = before.state_dict()  # 12 samples of epoch 0 read by 2 ranks
    read = {i for r in range(2) for b in _pass(2, r, 0)[:3] for i in b}
    rest = set()
    for rank in range(3):  # world 3, micro batch 2: 12 = 2 micro batches on each rank already read
        loader = build_dataloader(DATA, 2, rank, 3)
        loader.load_state_dict(state)
        rest |= {i for b in _ids(list(loader)) for i in b}
    assert read.isdisjoint(rest) and read | rest == set(range(48))


def test_another_epoch_starts_fresh_and_bad_positions_are_refused() -> None:
    loader = build_dataloader(DATA, 2, 0, 2)
    loader.load_state_dict({"epoch": 1, "samples": 8, "seed": 0, "world_size": 2, "micro_batch_size": 2})
    loader.set_epoch(2)
    assert _ids(list(loader)) == _pass(2, 0, 2)
    with pytest.raises(EngineError, match="does not split into whole micro batches of 2 over 4 ranks"):
        build_dataloader(DATA, 2, 0, 4).load_state_dict(
            {"epoch": 0, "samples": 12, "seed": 0, "world_size": 2, "micro_batch_size": 3})
    with pytest.raises(EngineError, match="seed 5"):
        loader.load_state_dict({"epoch": 0, "samples": 0, "seed": 5, "world_size": 2, "micro_batch_size": 2})
