"""A DistributedSampler-backed DataLoader of the micro batch size (``training_data`` in initialize).

The loader knows where it is - the sampler's epoch and how many micro batches this
pass has handed out - so a checkpoint can carry that position and a resumed run
continues at the next micro batch, with the same epoch and the same shuffle.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from typing import Any

from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

from zerorun.engine.errors import EngineError


class ResumableSampler(DistributedSampler):
    """A DistributedSampler whose next pass may skip the samples a previous run already read."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.skip = 0
        """Samples of this rank to skip at the start of the next pass (one-shot)."""

    def set_epoch(self, epoch: int) -> None:
        if epoch != self.epoch:
            self.skip = 0  # a resume position belongs to its own epoch; another epoch starts at its beginning
        super().set_epoch(epoch)

    def __iter__(self) -> Iterator[int]:
        skip, self.skip = self.skip, 0
        return itertools.islice(super().__iter__(), skip, None)


class TrainingDataLoader(DataLoader):
    """The loader ``initialize(training_data=...)`` returns; ``state_dict`` is its data position.

    ``set_epoch(e)`` (or ``loader.sampler.set_epoch(e)``) picks the shuffle of epoch ``e``
    as with any DistributedSampler. After ``load_state_dict`` the next pass of the saved
    epoch starts at the first micro batch the saved run had not handed out yet.
    """

    sampler: ResumableSampler

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.batches_done = 0
        """Micro batches handed out by the current (or last) pass over this rank's samples."""

    @property
    def epoch(self) -> int:
        return self.sampler.epoch

    def set_epoch(self, epoch: int) -> None:
        self.sampler.set_epoch(epoch)

    def __iter__(self) -> Iterator[Any]:
        self.batches_done = self.sampler.skip // self.micro_batch_size
        for batch in super().__iter__():
            self.batches_done += 1
            yield batch

    @property
    def micro_batch_size(self) -> int:
        assert self.batch_size is not None
        return self.batch_size

    def state_dict(self) -> dict[str, Any]:
        """The position as global samples read in this epoch (so it also loads at another world size)."""
        world = self.sampler.num_replicas
        return {"epoch": self.sampler.epoch, "samples": self.batches_done * self.micro_batch_size * world,
                "seed": self.sampler.seed, "world_size": world, "micro_batch_size": self.micro_batch_size}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue at ``state``'s position: the next pass of its epoch skips what was read."""
        world, samples = self.sampler.num_replicas, int(state["samples"])
        if state["seed"] != self.sampler.seed:
            raise EngineError(f"the checkpoint's data order used seed {state['seed']}, this loader uses "
                              f"{self.sampler.seed}", "build the loader with the seed of the saved run")
        if samples % (world * self.micro_batch_size):
            raise EngineError(
                f"the checkpoint read {samples} samples of epoch {state['epoch']} "
                f"(world {state['world_size']} x micro batch {state['micro_batch_size']}), which does not split "
                f"into whole micro batches of {self.micro_batch_size} over {world} ranks",
                "resume at a world size and micro batch size that divide it, or start the next epoch fresh "
                "(load_checkpoint, then loader.set_epoch(epoch + 1))",
            )
        self.sampler.set_epoch(int(state["epoch"]))
        self.sampler.skip = samples // world
        self.batches_done = self.sampler.skip // self.micro_batch_size


def build_dataloader(dataset: Dataset[Any], micro_batch_size: int, rank: int, world_size: int,
                     collate_fn: Callable[..., Any] | None = None, seed: int = 0) -> TrainingDataLoader:
    """Each rank reads its own 1/world of every epoch, ``micro_batch_size`` samples at a time.

    Like DeepSpeed's loader, the sampler shuffles (seeded identically on every rank) and
    the last incomplete batch is dropped so every rank runs the same number of steps.
    """
    sampler = ResumableSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=seed,
                               drop_last=True)
    return TrainingDataLoader(dataset, batch_size=micro_batch_size, sampler=sampler, collate_fn=collate_fn,
                              drop_last=True)
