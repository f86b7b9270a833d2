"""The ZeRO stage as a policy, picked once when the engine is built.

This is the only module where a stage number appears. Everything else asks the policy's
questions (is the optimizer sharded? the gradients? the parameters?) and uses the
gradient reducer it picks.
"""

from __future__ import annotations

from dataclasses import dataclass

from zerorun.engine.comm.collectives import Collectives
from zerorun.engine.errors import EngineError
from zerorun.engine.mechanism.accumulator import GradHome
from zerorun.engine.mechanism.buckets import FlatBucket
from zerorun.engine.mechanism.full_grads import FullGradSync
from zerorun.engine.mechanism.gather import GatherCoordinator
from zerorun.engine.mechanism.grad_sync import GradSyncBase, ReducePolicy
from zerorun.engine.mechanism.sharded_grads import ShardedGradSync, UnitGradSync


@dataclass(frozen=True)
class StagePolicy:
    """What a ZeRO stage partitions across data-parallel ranks."""

    stage: int
    shard_optimizer: bool  # fp32 master + optimizer state only for the rank's chunk
    shard_gradients: bool  # only the rank's reduced gradient chunk is kept
    shard_parameters: bool = False  # parameters too live as shards, gathered unit by unit around their use

    def grad_sync(self, buckets: list[FlatBucket], coll: Collectives, reduce: ReducePolicy,
                  coordinator: GatherCoordinator | None = None, coalesce_numel: int = 0,
                  replica: Collectives | None = None, home: GradHome | None = None) -> GradSyncBase:
        """The reducer: all-reduce (or reduce-scatter into the owned chunk) in layout order, or, with sharded
        parameters, reduce-scatter per unit as its gradients complete (small units coalesced), over ``coll``
        (the shard group), then summed across ``replica`` (MiCS) at the boundary.

        ``home`` (optimizer offload): the host memory the gradient sums live in, each reduced chunk landed
        there during backward. The sharded reducer is the one that lands them, so stage 1 with offload
        reduces as stage 2 does (every micro-step, from staging buffers): a full gradient buffer kept on
        the device is what offload exists to drop (DeepSpeed's stage 1 keeps none either at one micro-step
        per step; with more it keeps the 16-bit ``param.grad`` between boundaries)."""
        if self.shard_parameters:
            assert coordinator is not None, "sharded parameters are released by the gather coordinator"
            return UnitGradSync(buckets, coll, reduce, coordinator, coalesce_numel,  # type: ignore[arg-type]
                                replica=replica, home=home)
        if self.shard_gradients or (home is not None and self.shard_optimizer):
            return ShardedGradSync(buckets, coll, reduce, home)
        return FullGradSync(buckets, coll, reduce, scatter=self.shard_optimizer)


_POLICIES = {
    0: StagePolicy(0, shard_optimizer=False, shard_gradients=False),
    1: StagePolicy(1, shard_optimizer=True, shard_gradients=False),
    2: StagePolicy(2, shard_optimizer=True, shard_gradients=True),
    3: StagePolicy(3, shard_optimizer=True, shard_gradients=True, shard_parameters=True),
}


def policy_for_stage(stage: int) -> StagePolicy:
    if stage not in _POLICIES:
        raise EngineError(f"zero_optimization.stage must be 0-3, got {stage}", "set stage to 0, 1, 2 or 3")
    return _POLICIES[stage]
