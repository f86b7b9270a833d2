"""Keys the schema accepts for DeepSpeed compatibility but the bundled engine never reads.

An existing ``ds_config.json`` must load unchanged, so these are not errors; but a
value that differs from the default would silently do nothing, so ``load_config``
warns once per key, naming it and what the engine does instead.
"""

from __future__ import annotations

from zerorun.config.problems import Problem, Severity
from zerorun.config.schema import ZerorunConfig

NO_EFFECT: dict[str, str] = {
    "zero_optimization.reduce_scatter": "gradients are always reduce-scattered (stages 2-3) or all-reduced",
    "zero_optimization.offload_optimizer.ratio": "offload moves the whole optimizer state",
    "zero_optimization.offload_optimizer.fast_init": "the optimizer state is created the one way",
    "zero_optimization.offload_optimizer.pipeline_read": "NVMe reads are not pipelined with the step",
    "zero_optimization.offload_optimizer.pipeline_write": "NVMe writes are not pipelined with the step",
    "zero_optimization.stage3_model_persistence_threshold": "only stage3_param_persistence_threshold is read",
    "zero_optimization.load_from_fp32_weights": "checkpoints always restore the fp32 masters they hold",
    "zero_optimization.elastic_checkpoint": "checkpoints always load into any world size",
    "zero_optimization.ignore_unused_parameters": "parameters without a gradient are always handled",
}
"""Dotted key -> what the engine does regardless of it."""


def _value(cfg: ZerorunConfig, path: str) -> object:
    node: object = cfg
    for part in path.split("."):
        node = getattr(node, part, None)
    return node


def _default(path: str) -> object:
    node: object = ZerorunConfig()
    for part in path.split("."):
        node = getattr(node, part, None)
    return node


def keys_without_effect(cfg: ZerorunConfig, given: frozenset[str]) -> list[Problem]:
    """A warning for each no-op key the file sets to something other than its default."""
    return [
        Problem(path, f"is accepted for DeepSpeed compatibility but has no effect in zerorun's engine "
                      f"({reason}); remove it", severity=Severity.WARNING)
        for path, reason in NO_EFFECT.items()
        if path in given and _value(cfg, path) != _default(path)
    ]

