"""DeepSpeed top-level blocks that zerorun does not implement.

Monitoring blocks are accepted (a warning says they have no effect) so that an
existing ``ds_config.json`` still loads; blocks that would change what training
computes are errors, because silently ignoring them would train something else.
"""

from __future__ import annotations

from typing import Any

from zerorun.config.problems import Problem, Severity

IGNORED = (
    "tensorboard",
    "wandb",
    "csv_monitor",
    "comet",
    "comms_logger",
    "dump_state",
    "autotuning",
    "dataloader_drop_last",
)
"""Accepted with a warning: they only affect logging or tooling."""

UNSUPPORTED = (
    "elasticity",
    "pipeline",
    "sparse_attention",
    "compression_training",
    "data_efficiency",
    "curriculum_learning",
    "tensor_parallel",
    "sequence_parallel_size",
    "hybrid_engine",
    "moe",
    "zenflow",
    "compile",
)
"""Errors: zerorun cannot honour them."""


def strip_compat(data: dict[str, Any]) -> list[Problem]:
    """Remove DeepSpeed-only blocks from ``data`` (a copy the caller owns); report them."""
    problems = []
    for key in IGNORED:
        if key in data:
            del data[key]
            problems.append(
                Problem(key, "is a DeepSpeed key that zerorun accepts but ignores", severity=Severity.WARNING)
            )
    for key in UNSUPPORTED:
        if key in data:
            value = data.pop(key)
            off = isinstance(value, dict) and value.get("enabled") is False
            if off:
                problems.append(
                    Problem(
                        key,
                        "is a DeepSpeed feature zerorun does not have (disabled here, so ignored)",
                        severity=Severity.WARNING,
                    )
                )
            else:
                problems.append(Problem(key, "is a DeepSpeed feature zerorun does not support; remove it"))
    return problems
