"""The ZeRO stage as a policy, picked once when the engine is built.

Nothing else in the engine asks which stage it runs: it asks the policy's questions
(is the optimizer sharded? are gradients?) and uses the gradient-sync strategy the
policy builds.
"""

from __future__ import annotations

from dataclasses import dataclass

from zerorun.engine.buckets import FlatBucket
from zerorun.engine.collectives import Collectives
from zerorun.engine.errors import EngineError
from zerorun.engine.grad_sync import BucketGradSync, GradSyncBase, PartitionedGradSync, ReducePolicy


@dataclass(frozen=True)
class StagePolicy:
    """What a ZeRO stage partitions across data-parallel ranks."""

    stage: int
    shard_optimizer: bool  # fp32 master + optimizer state only for the rank's chunk
    shard_gradients: bool  # only the rank's reduced gradient chunk is kept
    shard_parameters: bool = False  # stage 3: parameters too live as shards (built by engine/stage3.py)

    def grad_sync(self, buckets: list[FlatBucket], coll: Collectives, reduce: ReducePolicy) -> GradSyncBase:
        if self.shard_gradients:
            return PartitionedGradSync(buckets, coll, reduce)
        return BucketGradSync(buckets, coll, reduce, scatter=self.shard_optimizer)


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
