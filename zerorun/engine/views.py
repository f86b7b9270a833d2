"""The engine as the modules that serve it read it: narrow Protocols, so none of them imports the Engine.

:class:`~zerorun.engine.engine.Engine` composes the checkpoint code (``engine/checkpoint/``), its
DeepSpeed and Hugging Face surfaces (``engine/surface/``) and the trial recorder (``engine/trial.py``);
each of those takes the engine through one of these views, which name only the state it reads
(or, for a checkpoint's counters, writes). The Engine satisfies every one structurally: it never
imports this module, and the arrow runs one way, from the engine down to what it offers.

- :class:`Placement`: where this rank sits (its process, the world's group, the shard group);
- :class:`Shards`: the layout and the shards (module, buckets and masters, optimizer);
- :class:`Configured`: the config and the policies picked from it (stage, precision);
- :class:`Counters`: the training counters, loss scale and batch facts a checkpoint carries;
- their unions for one consumer each: :class:`ModelView` (the 16-bit save, the HF surface),
  :class:`CheckpointView` (save and load) and :class:`TrialView` (an autotune trial).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import torch
    from torch import nn

    from zerorun.config.schema import ZerorunConfig
    from zerorun.engine.build import Parts
    from zerorun.engine.comm.bootstrap import DistContext
    from zerorun.engine.comm.collectives import Collectives
    from zerorun.engine.numerics.loss_scaler import ScalerState
    from zerorun.engine.numerics.precision import PrecisionPolicy
    from zerorun.engine.policy import StagePolicy
    from zerorun.engine.training.dataloader import TrainingDataLoader
    from zerorun.engine.training.schedulers import LRSchedulerLike


class Placement(Protocol):
    """Where this rank sits: its process, the world's group and the group the states are sharded over."""

    @property
    def ctx(self) -> DistContext: ...

    @property
    def coll(self) -> Collectives: ...

    @property
    def shard_coll(self) -> Collectives: ...


class Shards(Placement, Protocol):
    """The layout and the shards: the module, its buckets, masters and gradient sync, the optimizer."""

    @property
    def module(self) -> nn.Module: ...

    @property
    def parts(self) -> Parts: ...

    @property
    def optimizer(self) -> torch.optim.Optimizer: ...


class Configured(Protocol):
    """The resolved config and the policies the engine picked from it."""

    @property
    def config(self) -> ZerorunConfig: ...

    @property
    def stage(self) -> StagePolicy: ...

    @property
    def precision(self) -> PrecisionPolicy: ...


class BatchFacts(Protocol):
    """The batch arithmetic of this run and its stage number (what a resumed run compares)."""

    @property
    def zero_stage(self) -> int: ...

    def train_batch_size(self) -> int: ...

    def gradient_accumulation_steps(self) -> int: ...

    def train_micro_batch_size_per_gpu(self) -> int: ...


class Counters(BatchFacts, Protocol):
    """What a checkpoint carries besides the shards: counters and loss scale (written back on load),
    the optimizer's hyper-parameters, the scheduler and the data loader's position."""

    global_steps: int
    micro_steps: int
    skipped_steps: int
    global_samples: int
    scaler: ScalerState

    @property
    def optimizer(self) -> torch.optim.Optimizer: ...  # its param groups' hyper-parameters (lr, betas)

    @property
    def lr_scheduler(self) -> LRSchedulerLike | None: ...

    @property
    def training_dataloader(self) -> TrainingDataLoader | None: ...


class ModelView(Shards, Configured, Protocol):
    """The 16-bit model save and the Hugging Face surface: the module and the config that says how to gather it."""


class CheckpointView(Shards, Configured, Counters, Protocol):
    """``save_checkpoint`` / ``load_checkpoint``: the shards, the config, and the counters they restore."""


class TrialView(Shards, Configured, BatchFacts, Protocol):
    """An autotune trial: the figures it records and the group it gathers them over."""

    @property
    def device(self) -> torch.device: ...

    def memory_breakdown(self) -> dict[str, int]: ...

    def reset_memory_peak(self) -> bool: ...

    def num_parameters(self) -> int: ...
