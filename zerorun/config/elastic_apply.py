"""Applying an ``elasticity`` block when a config loads: the batch triple comes from it.

As in DeepSpeed, an enabled block owns ``train_batch_size``, the micro batch and the
accumulation: giving any of them is an error unless ``ignore_non_elastic_batch_info``
is true (then they are overridden, with a warning). With a world size (the engine always
has one, at every start and restart) the three are set from ``elastic.compute``; without
one (``validate`` with no ``--world-size``) they are left to run time, with a note.
"""

from __future__ import annotations

from typing import Any

from zerorun.config.elastic import BATCH_KEYS, ElasticError, compute, enabled, parse_block
from zerorun.config.problems import Problem, Severity


def _batch_keys_problem(raw: dict[str, Any], ignore: bool) -> Problem | None:
    given = [key for key in BATCH_KEYS if key in raw]
    if not given:
        return None
    if ignore:
        return Problem(given[0], "is overridden by the elasticity block (ignore_non_elastic_batch_info is true)",
                       severity=Severity.WARNING)
    return Problem(given[0], f"{', '.join(given)} cannot be set with an enabled elasticity block, which computes "
                             "the batch for each world size; remove them, or set "
                             "elasticity.ignore_non_elastic_batch_info: true to have them overridden")


def apply_elasticity(raw: dict[str, Any], world_size: int | None) -> list[Problem]:
    """Pop ``elasticity`` from ``raw`` (a copy the caller owns); when enabled, write the batch triple in its place."""
    if "elasticity" not in raw:
        return []
    block = raw.pop("elasticity")
    if not enabled(block):
        return [Problem("elasticity", "is disabled, so the batch keys are used as given", severity=Severity.NOTE)]
    try:
        spec = parse_block(block)
        plan = compute(block, world_size)
    except ElasticError as err:
        return [Problem(err.key, f"{err.message}; {err.hint}")]
    problems = [p for p in [_batch_keys_problem(raw, spec.ignore_non_elastic_batch_info)] if p is not None]
    for key in BATCH_KEYS:
        raw.pop(key, None)
    if plan.world_size is None:
        text = f"valid world sizes {list(plan.valid_worlds)}" if plan.valid_worlds else "worlds known at run time"
        problems.append(Problem("elasticity", f"the batch is computed at run time: train_batch_size "
                                              f"{plan.train_batch_size}, {text}", severity=Severity.NOTE))
        return problems
    assert plan.micro_batch is not None and plan.gradient_accumulation_steps is not None
    raw.update(zip(BATCH_KEYS, (plan.train_batch_size, plan.micro_batch, plan.gradient_accumulation_steps),
                   strict=True))
    return problems
