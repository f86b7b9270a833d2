"""The starting point of a tuning run: the user's config, resolved, and what it fixes.

Everything here is read from the config file and the world size before any trial runs:
the stage to tune, the starting value of every knob (``"auto"`` resolved as the engine
would), the global batch, and the memory context the pruning uses.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from zerorun.autotune.prune import MemoryContext
from zerorun.autotune.space import ACCUMULATION, MICRO_BATCH, STAGE_KNOBS, SpaceError, micro_batch_choices
from zerorun.estimate import Dtype, Optimizer, Placement, Training


@dataclass(frozen=True)
class StartPoint:
    """The user's config and what the tuner derives from it."""

    path: Path
    config: dict[str, Any]  # the file's own keys, unresolved: best.yaml starts from these
    world_size: int
    stage: int
    knobs: dict[str, Any]  # the starting value of every knob of ``stage``
    fixed: dict[str, Any] = field(default_factory=dict)  # sent with every trial (a --stage change)
    micro_batches: list[tuple[int, int]] | None = None  # with --tune-micro-batch
    dtype: Dtype | None = None
    optimizer: Optimizer | None = None


def load_start(path: str | Path, *, world_size: int, stage: int | None = None, hidden_size: int | None = None,
               tune_micro_batch: bool = False) -> StartPoint:
    """Validate ``path`` for ``world_size`` ranks and read the starting knobs from it."""
    from zerorun.config import load_config
    from zerorun.config.read import read_source
    from zerorun.estimate.from_config import config_facts

    cfg = load_config(str(path), world_size=world_size, hidden_size=hidden_size)
    data, _ = read_source(str(path))
    own_stage = int(cfg.zero_optimization.stage)
    tuned = own_stage if stage is None else stage
    if tuned not in STAGE_KNOBS:
        raise SpaceError(
            f"{path}: zero_optimization.stage is {tuned}; stage 0 has no bucket or prefetch knobs to tune",
            hint="tune a ZeRO stage with --stage 2 (or 1, or 3), or set zero_optimization.stage in the config",
        )
    zero = cfg.zero_optimization
    knobs: dict[str, Any] = {}
    for name in STAGE_KNOBS[tuned]:
        value = getattr(zero, name, None)
        if name == "overlap_comm" and (value is None or tuned != own_stage):
            value = tuned == 3 if "overlap_comm" not in (data.get("zero_optimization") or {}) else value
        knobs[name] = value if isinstance(value, bool) or value is None else int(value)
    micro_batches = None
    if tune_micro_batch:
        micro_batches = micro_batch_choices(int(cfg.train_batch_size), world_size)
        knobs[MICRO_BATCH] = int(cfg.train_micro_batch_size_per_gpu)
        knobs[ACCUMULATION] = int(cfg.gradient_accumulation_steps)
    facts = config_facts(str(path), world_size=world_size, hidden_size=hidden_size)
    return StartPoint(
        path=Path(path), config=data, world_size=world_size, stage=tuned, knobs=knobs,
        fixed={"stage": tuned} if tuned != own_stage else {}, micro_batches=micro_batches,
        dtype=facts.dtype, optimizer=facts.optimizer,
    )


def memory_context(start: StartPoint, params: int | None, gpu_memory: int | None) -> MemoryContext | None:
    """The pruning's fixed inputs; None when the parameter count or the GPU size is unknown."""
    if not params or not gpu_memory:
        return None
    training = Training(params, start.world_size, **{
        k: v for k, v in (("dtype", start.dtype), ("optimizer", start.optimizer)) if v is not None
    })
    return MemoryContext(training=training, placement=Placement(start.stage), gpu_memory=gpu_memory,
                         gpus_per_node=start.world_size)
